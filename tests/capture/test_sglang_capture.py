"""SGLang target capture on CPU (SGLang itself is CUDA-only and never installed here).

* the pure parts of ekka_core/capture/sglang_tracing.py on SGLang-shaped batches: ForwardBatch → rows, the row
  ledger's proof, routing SGLang's direct ``model.forward(...)`` through module hooks, graph-runner detection;
* the driver (ekka_core/capture/sglang_runner.py) end to end against tests/support/fake_sglang.py — a stand-in following
  SGLang 0.5.23's Engine / scheduler / ForwardBatch API, running a small SGLang-shaped model built from a zoo HF
  Llama: chunked prefill of two prompts of different lengths, mixed prefill+decode passes, decode passes — whose
  trace is checked step by step, round-tripped through the loader and compared row by row with HF's
  teacher-forced trace of the same tokens; tensor parallelism's rank traces and unsharding;
* the refusals: no sglang (through the real CLI), no CUDA, engine arguments that would hide calls from the hooks;
* the real SGLang 0.5.23 sources (fetched from the wheel, parsed with the libcst static index, never imported)
  still declare what the runner relies on.

The real run on a GPU is scripts/gpu-check.sh.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ekka_core.align import Traces, gather_rows, prove_alignment
from ekka_core.capture import hf_runner, sglang_runner, sglang_tracing
from ekka_core.capture.rows import RowLedger
from ekka_core.capture.sglang_tracing import BatchLayout, batch_layout
from ekka_core.capture.trace import SCHEMA, TensorRef, Trace
from ekka_core.contracts.errors import BadInput, InternalFailure
from ekka_core.mapping import Endpoint
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.tree.static import StaticIndex
import fake_sglang
from fake_sglang import ForwardBatch, ForwardMode

REPO_ROOT = Path(__file__).resolve().parents[2]
SGLANG_VERSION = os.environ.get("EKKA_SGLANG_VERSION", "0.5.23")
# A short and a long prompt: with a 16-token prefill budget the long one is prefilled in chunks while the short
# one already decodes (mixed passes).
PROMPTS = ["The capital of France is",
           "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories."]
NEW_TOKENS = 4
CHUNKED = {"chunked_prefill_size": 16, "enable_mixed_chunk": True}


def _batch(mode: ForwardMode, entries: list[tuple[str, int, int]], **extra) -> ForwardBatch:
    """A ForwardBatch for (request id, first position, rows) entries, laid out as SGLang does."""
    positions = [p for _, first, n in entries for p in range(first, first + n)]
    lens = [n for _, _, n in entries]
    extend = mode != ForwardMode.DECODE
    fields = dict(forward_mode=mode, batch_size=len(entries), input_ids=torch.arange(len(positions)),
                  req_pool_indices=torch.tensor([7 + i for i in range(len(entries))]),
                  seq_lens=torch.tensor([first + n for _, first, n in entries]),
                  positions=torch.tensor(positions, dtype=torch.int32), rids=[r for r, _, _ in entries],
                  extend_seq_lens_cpu=lens if extend else None,
                  extend_prefix_lens_cpu=[first for _, first, _ in entries] if extend else None)
    return ForwardBatch(**{**fields, **extra})


# ---------------------------------------------------------------------------------------------------------------
# ForwardBatch → rows

def test_extend_of_several_requests_of_different_lengths():
    fb = _batch(ForwardMode.EXTEND, [("a", 0, 3), ("b", 0, 5), ("c", 4, 2)])   # c: a chunk after a 4-token prefix
    lay = batch_layout(fb, None)
    assert lay == BatchLayout(["a"] * 3 + ["b"] * 5 + ["c"] * 2, [0, 1, 2, 0, 1, 2, 3, 4, 4, 5], "EXTEND")


def test_mixed_chunk_lays_decodes_out_as_one_row_extends():
    fb = _batch(ForwardMode.MIXED, [("long", 16, 4), ("short", 9, 1), ("other", 12, 1)])
    lay = batch_layout(fb, fb.positions)
    assert lay.reqs == ["long"] * 4 + ["short", "other"] and lay.pos == [16, 17, 18, 19, 9, 12]
    assert lay.mode == "MIXED" and lay.problem is None


def test_decode_is_one_row_per_request_and_padding_rows_belong_to_none():
    fb = _batch(ForwardMode.DECODE, [("a", 9, 1), ("b", 30, 1)])
    assert batch_layout(fb, None) == BatchLayout(["a", "b"], [9, 30], "DECODE")
    padded = torch.tensor([9, 30, 0, 0])            # a padded batch: rows past the last request
    assert batch_layout(fb, padded).reqs == ["a", "b", None, None]


def test_layout_falls_back_to_pool_slots_and_reports_what_it_cannot_lay_out():
    fb = _batch(ForwardMode.DECODE, [("a", 3, 1), ("b", 5, 1)], rids=None)
    assert batch_layout(fb, None).reqs == ["slot:7", "slot:8"]
    verify = batch_layout(_batch(ForwardMode.TARGET_VERIFY, [("a", 3, 4)]), None)
    assert verify.reqs == [None] * 4 and "TARGET_VERIFY" in verify.problem
    short = batch_layout(_batch(ForwardMode.EXTEND, [("a", 0, 3)]), torch.tensor([0, 1]))
    assert short.reqs == ["a", "a"] and "2 rows" in short.problem
    idle = batch_layout(_batch(ForwardMode.IDLE, []), None)
    assert idle == BatchLayout([], [], "IDLE")
    # multimodal rope passes [3, rows] positions to the model; the batch keeps the text positions
    mrope = batch_layout(_batch(ForwardMode.EXTEND, [("a", 0, 2)]), torch.zeros(3, 2))
    assert mrope.pos == [0, 1]


def test_layout_of_call_finds_the_forward_batch_in_positional_or_keyword_arguments():
    fb = _batch(ForwardMode.EXTEND, [("a", 0, 2)])
    by_position = sglang_tracing.layout_of_call((fb.input_ids, fb.positions, fb), {})
    by_keyword = sglang_tracing.layout_of_call((fb.input_ids,), {"positions": fb.positions, "forward_batch": fb})
    assert by_position == by_keyword == BatchLayout(["a", "a"], [0, 1], "EXTEND")
    assert "without a ForwardBatch" in sglang_tracing.layout_of_call((fb.input_ids, fb.positions), {}).problem


def _see(ledger: RowLedger, layout: BatchLayout, input_ids: torch.Tensor) -> None:
    ledger.see(layout.reqs, layout.pos, input_ids, layout.problem)


def test_row_ledger_proves_each_token_traced_once_with_the_driver_token():
    tokens = [[5, 6, 7, 8], [9, 10, 11]]
    good = RowLedger()
    _see(good, batch_layout(_batch(ForwardMode.EXTEND, [("r0", 0, 3), ("r1", 0, 2)]), None), torch.tensor([5, 6, 7, 9, 10]))
    _see(good, batch_layout(_batch(ForwardMode.DECODE, [("r0", 3, 1), ("r1", 2, 1)]), None), torch.tensor([8, 11]))
    assert good.proof({"r0": 0, "r1": 1}, tokens) == []

    gap = RowLedger()
    _see(gap, batch_layout(_batch(ForwardMode.EXTEND, [("r0", 2, 2)]), None), torch.tensor([7, 8]))
    assert any("positions [0, 1] were never traced" in p for p in gap.proof({"r0": 0}, tokens[:1]))

    swapped = RowLedger()   # rows attributed to the wrong request
    _see(swapped, batch_layout(_batch(ForwardMode.EXTEND, [("r1", 0, 4), ("r0", 0, 3)]), None),
                torch.tensor([5, 6, 7, 8, 9, 10, 11]))
    assert any("fed other tokens" in p for p in swapped.proof({"r0": 0, "r1": 1}, tokens))

    twice = RowLedger()   # a retracted request recomputed
    for _ in range(2):
        _see(twice, batch_layout(_batch(ForwardMode.EXTEND, [("r1", 0, 3)]), None), torch.tensor([9, 10, 11]))
    problems = twice.proof({"r1": 1, "x": 0}, [[1], tokens[1]])
    assert any("more than once" in p and "mem_fraction_static" in p for p in problems)
    assert any("sequence 0: positions [0]" in p for p in problems)

    stranger = RowLedger()
    _see(stranger, batch_layout(_batch(ForwardMode.DECODE, [("warmup", 0, 1)]), None), torch.tensor([1]))
    assert any("did not send" in p for p in stranger.proof({}, []))


# ---------------------------------------------------------------------------------------------------------------
# Getting hooks to fire

class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, pp_proxy_tensors: object = None) -> torch.Tensor:
        return self.lin(x)


def test_direct_forward_calls_run_the_root_hooks_once():
    model, seen = _Tiny(), []
    model.register_forward_pre_hook(lambda m, a: seen.append("pre"))
    model.register_forward_hook(lambda m, a, o: seen.append("post"))
    x = torch.ones(1, 2)
    model.forward(x)
    assert seen == []                                   # what SGLang's runners do: no root hook fires
    restore = sglang_tracing.route_forward_through_call(model)
    assert "pp_proxy_tensors" in inspect.signature(model.forward).parameters   # SGLang inspects it
    assert torch.equal(model.forward(x), model.lin(x)) and seen == ["pre", "post"]
    seen.clear()
    model(x)                                            # an ordinary call is not routed twice
    assert seen == ["pre", "post"]
    restore()
    seen.clear()
    model.forward(x)
    assert seen == [] and "forward" not in model.__dict__


def test_graph_runners_in_use():
    runner = fake_sglang.ModelRunner(_Tiny())
    assert sglang_tracing.graph_runners_in_use(runner) == []
    runner.decode_cuda_graph_runner = object()
    runner.prefill_cuda_graph_runner = object()
    assert sglang_tracing.graph_runners_in_use(runner) == ["decode_cuda_graph_runner", "prefill_cuda_graph_runner"]


def test_tp_layout_from_sglang_style_parallel_linears():
    class Column(nn.Module):
        def __init__(self, output_size: int, output_sizes: list[int] | None = None, gather: bool = False):
            super().__init__()
            self.output_size, self.gather_output = output_size, gather
            if output_sizes:
                self.output_sizes = output_sizes

    model = nn.Module()
    model.qkv_proj = Column(512, [256, 128, 128])
    model.gate_up_proj = Column(1024, [512, 512])
    model.lm = Column(100)
    model.gathered = Column(64, gather=True)
    model.norm = nn.LayerNorm(4)
    assert sglang_tracing.tp_layout(model) == {"qkv_proj": {"blocks": [256, 128, 128]},
                                               "gate_up_proj": {"blocks": [512, 512]}, "lm": {"blocks": [100]}}


# ---------------------------------------------------------------------------------------------------------------
# Refusals

@pytest.mark.parametrize("key, value, words", [
    ("disable_cuda_graph", False, "CUDA graphs"),
    ("enable_torch_compile", True, "torch.compile"),
    ("disable_radix_cache", False, "radix"),
    ("cuda_graph_config", {"decode": {"backend": "full"}}, "CUDA graphs"),
    ("cuda_graph_backend_decode", "full", "CUDA graphs"),
    ("speculative_algorithm", "EAGLE", "speculative"),
    ("dp_size", 2, "data parallelism"),
    ("pp_size", 2, "pipeline"),
])
def test_engine_args_that_hide_calls_from_the_hooks_are_bad_input(key, value, words):
    spec = DiagnosisSpec(model="/m", prompts=["hi"], target="sglang", engine_args={key: value})
    with pytest.raises(BadInput) as e:
        sglang_runner.engine_args(spec)
    assert e.value.exit_code == 2 and key in e.value.message and words in e.value.message
    assert key in e.value.fix


def test_engine_args_for_a_traced_run():
    spec = DiagnosisSpec(model="/m", prompts=["hi"], target="sglang", dtype="float16",
                         engine_args={"mem_fraction_static": 0.25, "tp_size": 2, "disable_cuda_graph": True})
    args = sglang_runner.engine_args(spec)
    assert args["model_path"] == "/m" and args["dtype"] == "float16"
    assert args["disable_cuda_graph"] is True and args["enable_torch_compile"] is False
    assert args["disable_radix_cache"] is True and args["disable_overlap_schedule"] is True
    assert args["mem_fraction_static"] == 0.25 and args["tp_size"] == 2


def test_without_sglang_the_cli_refuses_with_exit_2(zoo_model, tmp_path):
    assert importlib.util.find_spec("sglang") is None, "sglang must not be installed in this environment"
    cmd = [sys.executable, "-m", "ekka_core.cli", "diagnose", "--model", str(zoo_model("llama")), "--target", "sglang",
           "--prompt", "hello", "--max-new-tokens", "2", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "SGLang is not installed" in proc.stderr and "--target vllm" in proc.stderr


def test_without_cuda_the_runner_refuses(monkeypatch, zoo_model, tmp_path):
    fake_sglang.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=["hi"], target="sglang")
    with pytest.raises(BadInput, match="no CUDA device"):
        sglang_runner.run(spec, tmp_path)


def test_an_architecture_sglang_does_not_support_is_bad_input(fake_gpu, monkeypatch, tmp_path):
    def refuse(self, **kwargs):
        raise ValueError("Model architectures ['EkkaImaginaryForCausalLM'] are not supported for now. "
                         "Supported architectures: dict_keys(['LlamaForCausalLM'])")

    monkeypatch.setattr(fake_gpu.Engine, "__init__", refuse)
    spec = DiagnosisSpec(model="/m", prompts=["hi"], target="sglang")
    with pytest.raises(BadInput, match="SGLang cannot load /m: Model architectures .* are not supported") as e:
        sglang_runner.run(spec, tmp_path)
    assert "Supported architectures" not in e.value.message


def test_an_engine_without_the_scheduler_override_point_is_refused():
    class OldEngine:
        def collective_rpc(self, method: str, **kwargs: object) -> None: ...

    with pytest.raises(BadInput, match="run_scheduler_process_func"):
        sglang_runner.traced_engine_class(OldEngine)


# ---------------------------------------------------------------------------------------------------------------
# The driver end to end against the fake SGLang

@pytest.fixture
def fake_gpu(monkeypatch):
    module = fake_sglang.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return module


def _spec(model: Path, **engine_args) -> DiagnosisSpec:
    return DiagnosisSpec(model=str(model), prompts=PROMPTS, target="sglang", dtype="float32",
                         max_new_tokens=NEW_TOKENS, engine_args={**CHUNKED, **engine_args})


@pytest.fixture(scope="module")
def sglang_run(zoo_model, tmp_path_factory):
    """One traced run through the driver, and HF's fp32 teacher-forced trace of the same tokens."""
    mp = pytest.MonkeyPatch()
    try:
        fake = fake_sglang.install(mp)
        mp.setattr(torch.cuda, "is_available", lambda: True)
        out = tmp_path_factory.mktemp("sglang")
        spec = _spec(zoo_model("llama"))
        result = sglang_runner.run(spec, out / "target")
        engine = fake.Engine.instances[-1]
    finally:
        mp.undo()
    target = Trace(out / "target")
    hf_runner.run(spec, target.run.token_ids, target.run.prompt_lens, "float32", "reference", out / "reference")
    return SimpleNamespace(spec=spec, result=result, target=target, reference=Trace(out / "reference"),
                           engine=engine, modes=engine.schedulers[0].forward_modes, out=out)


def test_the_driver_builds_a_traced_engine_and_drives_it_through_collective_rpc(sglang_run):
    engine = sglang_run.engine
    assert engine.shut_down
    assert engine.server_args["disable_cuda_graph"] is True and engine.server_args["disable_radix_cache"] is True
    assert engine.run_scheduler_process_func is sglang_tracing.run_scheduler_process
    commands = [(m, json.loads(kw["request"])["cmd"]) for m, kw in engine.rpc_calls]
    assert commands == [("ekka_trace_control", "start"), ("ekka_trace_control", "close")]
    # the passes SGLang would run for this batch: chunked prefill, prefill chunks mixed with decodes, decodes
    assert sglang_run.modes[0] == "EXTEND" and "MIXED" in sglang_run.modes and sglang_run.modes[-1] == "DECODE"
    assert sglang_run.result == {"steps": len(sglang_run.modes), "calls": len(sglang_run.target.calls), "tp": 1}


def test_trace_records_the_run(sglang_run):
    run = sglang_run.target.run
    assert run.complete and run.failure is None
    assert run.framework == "sglang" and run.framework_version == fake_sglang.VERSION and run.role == "target"
    assert run.engine_args["disable_cuda_graph"] is True and "model_path" not in run.engine_args
    tokenizer = sglang_run.engine.tokenizer_manager.tokenizer
    assert run.own_prompt_token_ids == [tokenizer.encode(p) for p in PROMPTS]
    assert run.prompt_lens == [len(p) for p in run.own_prompt_token_ids]
    assert [len(g) for g in run.generated_ids] == [NEW_TOKENS, NEW_TOKENS]
    assert run.token_ids == [p + g[:-1] for p, g in zip(run.own_prompt_token_ids, run.generated_ids)]
    assert run.declared["model_class"].endswith("fake_sglang.LlamaForCausalLM") and run.declared["tp_layout"] == {}


def test_steps_lay_out_every_token_once_with_its_phase(sglang_run):
    trace, run = sglang_run.target, sglang_run.target.run
    assert len(trace.steps) == len(sglang_run.modes)
    seen: dict[tuple[int, int], int] = {}
    for step in trace.steps:
        for s, p in zip(step.seq, step.pos):
            seen[(s, p)] = seen.get((s, p), 0) + 1
    assert seen == {(s, p): 1 for s, ids in enumerate(run.token_ids) for p in range(len(ids))}
    first = trace.steps[0]                          # both prompts start in one pass, the long one chunked
    assert first.phase == "prefill" and set(first.seq) == {0, 1} and max(first.pos) < run.prompt_lens[1] - 1
    for step, mode in zip(trace.steps, sglang_run.modes):
        decoding = any(p >= run.prompt_lens[s] for s, p in zip(step.seq, step.pos))
        assert step.phase.startswith("decode:") == decoding, (step.index, step.phase, mode)
        if mode == "DECODE":                        # one row per request still generating
            assert len(step.seq) == len(set(step.seq)) and step.phase.startswith("decode:")
    assert any(m == "DECODE" and sorted(s.seq) == [0, 1] for s, m in zip(trace.steps, sglang_run.modes))
    mixed = trace.steps[sglang_run.modes.index("MIXED")]   # the long prompt's chunk and the short one's decode
    assert 0 in mixed.seq and 1 in mixed.seq and mixed.phase.startswith("decode:")


def test_the_fed_token_ids_sit_at_their_sequence_positions(sglang_run):
    trace = sglang_run.target
    for call in (c for c in trace.calls if c.module == ""):
        step = trace.steps[call.step]
        input_ids = trace.tensor(call.inputs[0]).tolist()
        assert input_ids == [trace.run.token_ids[s][p] for s, p in zip(step.seq, step.pos)]


def test_module_calls_are_sglang_shaped(sglang_run):
    trace = sglang_run.target
    steps = len(trace.steps)
    by = trace.by_module()
    assert len(by[""]) == steps                     # the root ran through its hooks on every direct forward call
    assert [len(by[f"model.layers.{i}"]) for i in range(4)] == [steps] * 4
    logits = by["logits_processor"]
    assert all(c.output_names[0] == "next_token_logits" for c in logits)   # SGLang's dataclass output
    # one logits row per request: "sampled" where a pass has more rows than requests (a decode row is its token)
    assert [c.rows for c in logits] == ["sampled" if len(trace.steps[c.step].seq) > len(set(trace.steps[c.step].seq))
                                        else "tokens" for c in logits]
    assert logits[0].rows == "sampled"
    rotary = by["model.layers.2.self_attn.rotary_emb"]   # one module object serves every layer
    assert rotary[0].shared_as == "model.layers.0.self_attn.rotary_emb"


def test_trace_round_trips_through_the_loader(sglang_run):
    index = json.loads((sglang_run.out / "target" / "index.json").read_text())
    assert index["schema"] == SCHEMA and index["run"]["framework"] == "sglang"
    assert not list(sglang_run.out.rglob("*.pkl")) and not list(sglang_run.out.rglob("*.pt"))
    again = Trace(sglang_run.out / "target")
    refs = [r for c in again.calls[:50] for r in c.outputs if isinstance(r, TensorRef)]
    for ref in refs:
        assert torch.equal(again.tensor(ref), sglang_run.target.tensor(ref))


def test_rows_line_up_with_the_hf_teacher_forced_trace(sglang_run):
    target, reference = sglang_run.target, sglang_run.reference
    assert target.run.token_ids == reference.run.token_ids
    prove_alignment(Traces(target, reference, reference))   # the pipeline's own proof: ids, embeddings, layer chain
    modules = ["model.embed_tokens", "model.norm"] + [f"model.layers.{i}{leaf}" for i in range(4)
                                                      for leaf in ("", ".self_attn.o_proj", ".mlp")]
    for module in modules:
        t = gather_rows(target, Endpoint([module]))
        r = gather_rows(reference, Endpoint([module]))
        assert set(t) == set(r) and len(t) == sum(len(ids) for ids in target.run.token_ids), module
        diff = max((t[k] - r[k]).abs().max().item() for k in t)
        assert diff < 1e-4, (module, diff)
    # logits: one row per request per pass, at its last position, against HF's logits there
    t = gather_rows(target, Endpoint(["logits_processor"]))
    r = gather_rows(reference, Endpoint([""], select="named:logits"))
    # every request of every pass (a prefill chunk's logits are computed too, and discarded by the scheduler)
    assert len(t) == sum(len({s for s in step.seq if s >= 0}) for step in target.steps)
    for key, row in t.items():
        assert torch.allclose(row, r[key], atol=1e-4), key


def test_tensor_parallel_ranks_are_traced_and_unsharded(fake_gpu, zoo_model, tmp_path, sglang_run):
    out = tmp_path / "target"
    sglang_runner.run(_spec(zoo_model("llama"), tp_size=2), out)
    assert [Trace(out / f"rank-{r}").run.tp_rank for r in (0, 1)] == [0, 1]
    assert Trace(out / "rank-1").run.tp_size == 2
    merged = Trace(out)
    assert merged.run.complete and merged.run.declared["unsharded_from"] == [str(out / "rank-0"), str(out / "rank-1")]
    a = gather_rows(merged, Endpoint(["model.layers.3.mlp"]))
    b = gather_rows(sglang_run.target, Endpoint(["model.layers.3.mlp"]))
    assert set(a) == set(b) and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_a_trace_that_fails_the_row_proof_is_kept_and_refused(fake_gpu, zoo_model, tmp_path, monkeypatch):
    generate = fake_gpu.Engine.generate

    def misreported(self, *args, **kwargs):   # the engine answers other tokens than it fed back
        outputs = generate(self, *args, **kwargs)
        outputs[0]["output_ids"][0] += 1
        return outputs

    monkeypatch.setattr(fake_gpu.Engine, "generate", misreported)
    with pytest.raises(InternalFailure, match="failed Ekka's checks.*fed other tokens") as e:
        sglang_runner.run(_spec(zoo_model("llama")), tmp_path / "target")
    assert e.value.exit_code == 3
    kept = Trace(tmp_path / "target")
    assert not kept.run.complete and kept.steps and kept.calls


def test_a_crash_during_generation_keeps_the_partial_trace(fake_gpu, zoo_model, tmp_path, monkeypatch):
    forward = fake_gpu.ModelRunner.forward
    passes = {"n": 0}

    def dies_on_the_third_pass(self, fb):
        passes["n"] += 1
        if passes["n"] == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return forward(self, fb)

    monkeypatch.setattr(fake_gpu.ModelRunner, "forward", dies_on_the_third_pass)
    with pytest.raises(InternalFailure, match="illegal memory access.*partial trace kept"):
        sglang_runner.run(_spec(zoo_model("llama")), tmp_path / "target")
    kept = Trace(tmp_path / "target")
    assert not kept.run.complete and "illegal memory access" in kept.run.failure
    assert len(kept.steps) == 2 and {c.step for c in kept.calls} == {0, 1}


def test_the_index_on_disk_is_readable_after_every_step(fake_gpu, zoo_model, tmp_path, monkeypatch):
    """If the engine process dies outright, the trace so far is on disk (marked incomplete)."""
    snapshots = []
    forward = fake_gpu.ModelRunner.forward

    def watched(self, fb):
        if (tmp_path / "target" / "index.json").exists():
            snapshots.append(len(Trace(tmp_path / "target").steps))
        return forward(self, fb)

    monkeypatch.setattr(fake_gpu.ModelRunner, "forward", watched)
    sglang_runner.run(_spec(zoo_model("llama")), tmp_path / "target")
    assert snapshots == list(range(1, len(snapshots) + 1)) and len(snapshots) >= 3


def test_trace_size_options_reach_the_scheduler(fake_gpu, zoo_model, tmp_path):
    spec = _spec(zoo_model("llama"))
    spec.trace_positions, spec.trace_modules = "0-3", r"^(model\.layers\.0|logits_processor)$"
    sglang_runner.run(spec, tmp_path / "target")
    trace = Trace(tmp_path / "target")
    assert trace.run.complete            # the row proof covers every row the model ran, recorded or not
    assert {c.module for c in trace.calls} == {"model.layers.0", "logits_processor"}
    first = trace.steps[0]                # positions 0-3 of each prompt, plus each request's sampled row
    assert sorted(zip(first.seq, first.pos)) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, trace.run.prompt_lens[0] - 1),
                                                 (1, 0), (1, 1), (1, 2), (1, 3), (1, max(first.pos))]


def test_tracing_control_errors_come_back_to_the_driver(fake_gpu, zoo_model):
    engine = sglang_runner.traced_engine_class(fake_gpu.Engine)(model_path=str(zoo_model("llama")))
    with pytest.raises(InternalFailure, match="unknown ekka_trace_control command 'pause'"):
        sglang_runner._control(engine, cmd="pause")
    runner = engine.schedulers[0].tp_worker.model_runner
    runner.decode_cuda_graph_runner = object()
    with pytest.raises(InternalFailure, match="replays CUDA graphs \\(decode_cuda_graph_runner\\)"):
        sglang_runner._control(engine, cmd="start", out_dir="/nonexistent", run={}, options={}, seq_by_rid={},
                               prompt_lens=[])


# ---------------------------------------------------------------------------------------------------------------
# The real SGLang sources still say what the runner relies on (parsed, never imported)

SOURCES = {
    "engine": "sglang/srt/entrypoints/engine.py",
    "scheduler": "sglang/srt/managers/scheduler.py",
    "io_struct": "sglang/srt/managers/io_struct.py",
    "forward_batch": "sglang/srt/model_executor/forward_batch_info.py",
    "eager_runner": "sglang/srt/model_executor/runner/eager_runner.py",
    "logits": "sglang/srt/layers/logits_processor.py",
    "llama": "sglang/srt/models/llama.py",
    "exec_args": "sglang/srt/arg_groups/fields/exec_.py",
}


@pytest.fixture(scope="module")
def sglang_sources() -> tuple[Path, StaticIndex]:
    fetch = REPO_ROOT / "scripts" / "fetch_sglang_sources.sh"
    done = subprocess.run(["bash", str(fetch), SGLANG_VERSION, *SOURCES.values()], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        pytest.fail(f"scripts/fetch_sglang_sources.sh failed (exit {done.returncode}):\n{done.stderr}")
    root = Path(done.stdout.strip().splitlines()[-1])
    index = StaticIndex.from_files([root / f for f in SOURCES.values()], roots=[root])
    assert "sglang" not in sys.modules
    return root, index


def _source(index: StaticIndex, qualname: str) -> str:
    c = index.get_class(qualname)
    assert c is not None, qualname
    return "\n".join(Path(c.file).read_text(encoding="utf-8").splitlines()[c.line - 1:c.end_line])


def test_sglang_sources_declare_what_the_runner_relies_on(sglang_sources):
    root, index = sglang_sources
    engine = _source(index, "sglang.srt.entrypoints.engine.Engine")
    # the scheduler-process override point, passed on to the launch, and the RPC reaching every scheduler
    assert "run_scheduler_process_func: Callable = staticmethod(run_scheduler_process)" in engine
    assert "run_scheduler_process_func=self.run_scheduler_process_func" in engine
    methods = index.get_class("sglang.srt.entrypoints.engine.Engine").methods
    assert {"collective_rpc", "generate", "shutdown"} <= set(methods)
    assert {"input_ids", "sampling_params", "rid"} <= set(methods["generate"].params)
    rpc = _source(index, "sglang.srt.managers.scheduler.Scheduler")
    assert "func = getattr(self, recv_req.method)" in rpc and "func(**recv_req.parameters)" in rpc
    assert re.search(r"parameters: Optional\[Dict\[str, Union\[bool, int, float, str, None\]\]\]",
                     _source(index, "RpcReqInput"))   # flat scalars only: Ekka sends one JSON string

    batch = index.get_class("sglang.srt.model_executor.forward_batch_info.ForwardBatch")
    defaults = {a.name for a in batch.attributes}
    assert {"rids", "positions", "extend_seq_lens_cpu", "extend_seq_lens"} <= defaults
    text = _source(index, "sglang.srt.model_executor.forward_batch_info.ForwardBatch")
    for line in ("forward_mode: ForwardMode", "batch_size: int", "req_pool_indices: torch.Tensor"):
        assert re.search(rf"^\s+{re.escape(line)}\s*$", text, re.M), line
    modes = {a.name for a in index.get_class("ForwardMode").attributes}
    assert {"EXTEND", "MIXED", "DECODE", "IDLE"} <= modes

    # the runners call model.forward(...) directly (hence route_forward_through_call), with the batch third
    eager = _source(index, "sglang.srt.model_executor.runner.eager_runner.EagerRunner")
    assert re.search(r"model_runner\.model\.forward\(\s*forward_batch\.input_ids,\s*forward_batch\.positions,"
                     r"\s*forward_batch,", eager)
    # a mixed pass runs as EXTEND with the decodes as 1-token extends
    assert "forward_batch.forward_mode = ForwardMode.EXTEND" in eager
    logits = index.get_class("LogitsProcessorOutput")
    assert "dataclasses.dataclass" in logits.decorators
    assert re.search(r"^\s+next_token_logits:", _source(index, "LogitsProcessorOutput"), re.M)
    args = (root / SOURCES["exec_args"]).read_text(encoding="utf-8")
    assert "disable_cuda_graph: A[bool" in args and "enable_torch_compile: A[" in args


def test_sglang_llama_declares_its_fused_weights(sglang_sources):
    _, index = sglang_sources
    stacked = index.get_class("sglang.srt.models.llama.LlamaForCausalLM").literal("stacked_params_mapping")
    assert sglang_tracing.packed_from_stacked(stacked) == {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                                           "gate_up_proj": ["gate_proj", "up_proj"]}
    model = SimpleNamespace(stacked_params_mapping=stacked)
    assert sglang_tracing.declared_weight_mapping(model)["packed_modules_mapping"]["qkv_proj"] == \
        ["q_proj", "k_proj", "v_proj"]

