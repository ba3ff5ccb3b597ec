"""The capture stage's storage: TraceWriter + ModuleTracer on a tiny hand-made model, read back through Trace.

The model mimics the shapes of a serving engine's forward pass: flat ``[tokens, hidden]`` activations, decoder
layers with Linear children, one parameter-free module object shared by both layers (like vLLM's rotary_emb),
and a head that returns one row per sequence (like vLLM's LogitsProcessor). Expected values are recorded
independently of the tracer (by recomputing the forward by hand), never copied from the tracer's own output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from ekka_core.capture.hooks import ModuleTracer
from ekka_core.capture.trace import INDEX, RunInfo, TensorRef, Trace, TraceWriter
from ekka_core.contracts.errors import BadInput

HIDDEN, VOCAB = 8, 16


class Rotate(nn.Module):
    """Parameter-free, shared by every layer (one object, several call sites)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, dims=[-1]) * 0.5


class DecoderLayer(nn.Module):
    def __init__(self, rot: Rotate):
        super().__init__()
        self.rot = rot
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.rot(x))
        y = self.down(h)
        # In-place on a child's output after the child returned (what fused kernels do): the trace must
        # still hold the value at hook time.
        h.mul_(0.0)
        return y + x


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, h: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return self.lm(h[last])


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.rot = Rotate()
        self.layers = nn.ModuleList([DecoderLayer(self.rot), DecoderLayer(self.rot)])
        self.head = Head()

    def forward(self, ids: torch.Tensor, last: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        h = self.embed(ids) * scale
        for layer in self.layers:
            h = layer(h)
        return self.head(h, last)


def _reference_forward(m: TinyModel, ids: torch.Tensor, last: torch.Tensor) -> dict[str, tuple]:
    """The forward recomputed by hand: module path -> (inputs, output) — what the trace must contain."""
    out: dict[str, tuple] = {}
    with torch.no_grad():
        e = m.embed.weight[ids]
        out["embed"] = ((ids,), e)
        h = e
        for i, layer in enumerate(m.layers):
            r = torch.flip(h, dims=[-1]) * 0.5
            out[f"layers.{i}.rot"] = ((h,), r)
            u = torch.nn.functional.linear(r, layer.up.weight, layer.up.bias)
            out[f"layers.{i}.up"] = ((r,), u)
            d = torch.nn.functional.linear(u, layer.down.weight, layer.down.bias)
            out[f"layers.{i}.down"] = ((u,), d)
            nh = d + h
            out[f"layers.{i}"] = ((h,), nh)
            h = nh
        logits = torch.nn.functional.linear(h[last], m.head.lm.weight)
        out["head.lm"] = ((h[last],), logits)
        out["head"] = ((h, last), logits)
        out[""] = ((ids, last), logits)
    return out


def _run(tmp: Path, dtype: torch.dtype = torch.float32, *, shard_bytes: int = 256 << 20,
         seed: int = 0) -> tuple[TinyModel, torch.Tensor, torch.Tensor, Path]:
    torch.manual_seed(seed)
    model = TinyModel().to(dtype).eval()
    # Two sequences flattened into one step, like vLLM: lengths 3 and 2, request ids "a" and "b".
    ids = torch.tensor([3, 5, 7, 1, 2])
    last = torch.tensor([2, 4])
    reqs, pos = ["a", "a", "a", "b", "b"], [0, 1, 2, 0, 1]
    writer = TraceWriter(tmp, RunInfo("vllm", "0", "target", "tiny", str(dtype).removeprefix("torch.")),
                         shard_bytes=shard_bytes)
    tracer = ModuleTracer(writer, lambda args, kwargs: (reqs, pos)).attach(model)
    with torch.no_grad():
        model(ids, last)
    tracer.resolve_steps({"a": 0, "b": 1}.__getitem__, [3, 2])
    tracer.detach()
    writer.close(complete=True)
    return model, ids, last, tmp


def _trace_rows(tmp: Path, model: nn.Module, x: torch.Tensor, *, role: str = "target", **tracer_options) -> Trace:
    """One traced forward of ``model`` over ``x``, its rows one request's positions 0…n-1, read back."""
    n = x.shape[0]
    writer = TraceWriter(tmp, RunInfo("test", "0", role, "m", "float32"))
    tracer = ModuleTracer(writer, lambda args, kwargs: ([0] * n, list(range(n))), **tracer_options).attach(model)
    with torch.no_grad():
        model(x)
    tracer.detach()
    tracer.resolve_steps(lambda r: r, [n])
    writer.close(complete=True)
    return Trace(tmp)


EXPECTED_ORDER = ["embed", "layers.0.rot", "layers.0.up", "layers.0.down", "layers.0",
                  "layers.1.rot", "layers.1.up", "layers.1.down", "layers.1", "head.lm", "head", ""]


def test_calls_are_in_completion_order_children_before_parents(tmp_path):
    *_, d = _run(tmp_path)
    trace = Trace(d)
    assert [c.module for c in trace.calls] == EXPECTED_ORDER
    assert [c.index for c in trace.calls] == list(range(len(EXPECTED_ORDER)))
    # every parent completes after all of its children
    pos = {c.module: c.index for c in trace.calls}
    for name, i in pos.items():
        for child, j in pos.items():
            if name and child.startswith(name + "."):
                assert j < i, (child, name)
    assert pos[""] == len(EXPECTED_ORDER) - 1
    by = trace.modules()
    assert by["layers.0"].cls == "DecoderLayer" and by["layers.0.up"].cls == "Linear"
    assert by["layers.0"].qualname.endswith("test_trace.DecoderLayer")
    # the class source location points at this file
    assert by["layers.0"].class_file and Path(by["layers.0"].class_file).name == "test_trace.py"
    assert isinstance(by["layers.0"].class_line, int) and by["layers.0"].class_line > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inputs_and_outputs_round_trip_bit_exactly(tmp_path, dtype):
    model, ids, last, d = _run(tmp_path, dtype)
    expected = _reference_forward(model, ids, last)
    trace = Trace(d)
    assert trace.run.dtype == str(dtype).removeprefix("torch.")
    for call in trace.calls:
        exp_in, exp_out = expected[call.module]
        assert len(call.outputs) == 1, call.module
        ref = call.outputs[0]
        assert isinstance(ref, TensorRef)
        got = trace.tensor(ref)
        assert got.dtype == exp_out.dtype and ref.dtype == str(exp_out.dtype).removeprefix("torch.")
        assert list(got.shape) == ref.shape == list(exp_out.shape)
        assert torch.equal(got, exp_out), f"{call.module} output differs"
        tensors_in = [trace.tensor(x) for x in call.inputs if isinstance(x, TensorRef)]
        assert len(tensors_in) == len(exp_in), call.module
        for g, e in zip(tensors_in, exp_in):
            assert g.dtype == e.dtype and torch.equal(g, e), f"{call.module} input differs"


def test_tensors_are_cloned_at_hook_time(tmp_path):
    # DecoderLayer zeroes its `up` output in place after `down` consumed it; the trace must keep the values.
    _, _, _, d = _run(tmp_path)
    trace = Trace(d)
    up_out = trace.tensor(trace.calls_of("layers.0.up")[0].outputs[0])
    down_in = trace.tensor(trace.calls_of("layers.0.down")[0].inputs[0])
    assert up_out.abs().sum() > 0
    assert torch.equal(up_out, down_in)


def test_shared_module_is_named_after_its_call_site(tmp_path):
    *_, d = _run(tmp_path)
    trace = Trace(d)
    # named_modules() registers the shared object once, under the first parent ("rot" at the root).
    rot_calls = [c for c in trace.calls if c.cls == "Rotate"]
    assert [c.module for c in rot_calls] == ["layers.0.rot", "layers.1.rot"]
    assert all(c.shared_as == "rot" for c in rot_calls)
    # non-shared modules carry no shared_as
    assert all(c.shared_as is None for c in trace.calls if c.cls != "Rotate")


def test_shared_module_keeps_registered_name_at_its_own_site(tmp_path):
    """When the first registration *is* a call site, that call has no shared_as, the other one does."""
    class Layer(nn.Module):
        def __init__(self, act):
            super().__init__()
            self.act = act

        def forward(self, x):
            return self.act(x) + 1

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            act = nn.Tanh()
            self.layers = nn.ModuleList([Layer(act), Layer(act)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    model = M()
    w = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "m", "float32"))
    ModuleTracer(w, lambda a, k: ([0, 0], [0, 1])).attach(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        model(x)
    w.close(complete=True)
    trace = Trace(tmp_path)
    acts = [c for c in trace.calls if c.cls == "Tanh"]
    assert [(c.module, c.shared_as) for c in acts] == [("layers.0.act", None), ("layers.1.act", "layers.0.act")]
    assert torch.equal(trace.tensor(acts[1].inputs[0]), torch.tanh(x) + 1)


def test_steps_layout_and_sampled_rows(tmp_path):
    *_, d = _run(tmp_path)
    trace = Trace(d)
    assert len(trace.steps) == 1
    step = trace.steps[0]
    assert step.seq == [0, 0, 0, 1, 1] and step.pos == [0, 1, 2, 0, 1] and step.phase == "prefill"
    rows = {c.module: c.rows for c in trace.calls}
    # The head returns one row per sequence (2) from a 5-token step: "sampled"; everything else per token.
    assert rows["head"] == "sampled" and rows["head.lm"] == "sampled" and rows[""] == "sampled"
    assert all(rows[m] == "tokens" for m in EXPECTED_ORDER if not m.startswith("head") and m)
    assert all(c.step == 0 for c in trace.calls)


def test_decode_steps_are_named_and_non_tensor_inputs_summarised(tmp_path):
    torch.manual_seed(0)
    model = TinyModel().eval()
    layouts = iter([(["a", "a", "a"], [0, 1, 2]), (["a"], [3]), (["a"], [4])])
    w = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "tiny", "float32"))
    tracer = ModuleTracer(w, lambda a, k: next(layouts)).attach(model)
    with torch.no_grad():
        model(torch.tensor([1, 2, 3]), torch.tensor([2]))
        model(torch.tensor([4]), torch.tensor([0]), scale=2.0)
        model(torch.tensor([5]), torch.tensor([0]), scale=3.0)
    tracer.resolve_steps(lambda r: 0, [3])
    w.close(complete=True)
    trace = Trace(tmp_path)
    assert [s.phase for s in trace.steps] == ["prefill", "decode:1", "decode:2"]
    assert [s.pos for s in trace.steps] == [[0, 1, 2], [3], [4]]
    roots = trace.calls_of("")
    assert [c.step for c in roots] == [0, 1, 2]
    # keyword float argument: stored as its repr, not as a tensor
    assert roots[1].inputs[-1] == "2.0" and roots[2].inputs[-1] == "3.0"
    assert len(trace.calls) == 3 * len(EXPECTED_ORDER)


def test_small_shards_produce_several_files_and_still_round_trip(tmp_path):
    model, ids, last, d = _run(tmp_path, shard_bytes=64)
    shards = sorted(d.glob("shard-*.safetensors"))
    assert len(shards) > 1
    trace = Trace(d)
    refs = [x for c in trace.calls for x in c.inputs + c.outputs if isinstance(x, TensorRef)]
    assert {r.shard for r in refs} == set(range(len(shards)))
    expected = _reference_forward(model, ids, last)
    for call in trace.calls:
        assert torch.equal(trace.tensor(call.outputs[0]), expected[call.module][1])


def test_rewriting_a_directory_removes_stale_shards(tmp_path):
    _run(tmp_path, shard_bytes=64)
    many = len(list(tmp_path.glob("shard-*.safetensors")))
    model, ids, last, d = _run(tmp_path, seed=1)          # default shard size: one shard
    assert many > 1 and len(list(d.glob("shard-*.safetensors"))) == 1
    trace = Trace(d)
    assert torch.equal(trace.tensor(trace.calls_of("")[0].outputs[0]), _reference_forward(model, ids, last)[""][1])


def test_incomplete_trace_is_kept_and_marked(tmp_path):
    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("kernel crashed")

    torch.manual_seed(0)
    model = TinyModel().eval()
    model.layers[1].down = Boom()
    w = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "tiny", "float32"))
    ModuleTracer(w, lambda a, k: ([0, 0], [0, 1])).attach(model)
    ids = torch.tensor([3, 4])
    with pytest.raises(RuntimeError, match="kernel crashed"), torch.no_grad():
        model(ids, torch.tensor([1]))
    w.close(complete=False, failure="RuntimeError: kernel crashed")
    trace = Trace(tmp_path)
    assert trace.run.complete is False
    assert trace.run.failure == "RuntimeError: kernel crashed"
    # everything that completed before the crash is there, with its data
    assert [c.module for c in trace.calls] == ["embed", "layers.0.rot", "layers.0.up", "layers.0.down",
                                               "layers.0", "layers.1.rot", "layers.1.up"]
    assert torch.equal(trace.tensor(trace.calls[0].outputs[0]), model.embed.weight[ids].detach())


def test_complete_trace_is_marked_complete(tmp_path):
    *_, d = _run(tmp_path)
    trace = Trace(d)
    assert trace.run.complete is True and trace.run.failure is None
    assert trace.run.framework == "vllm" and trace.run.role == "target"


def test_only_safetensors_and_json_index_are_written(tmp_path):
    *_, d = _run(tmp_path, torch.bfloat16, shard_bytes=200)
    names = [p.name for p in d.rglob("*")]
    assert INDEX in names
    others = [n for n in names if n != INDEX]
    assert others and all(n.endswith(".safetensors") for n in others), names
    # each shard is real safetensors: 8-byte little-endian header length, then a JSON header (no pickle, no zip)
    for p in d.glob("*.safetensors"):
        raw = p.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        assert all(k == "__metadata__" or {"dtype", "shape", "data_offsets"} <= set(v) for k, v in header.items())


def test_trace_without_index_is_bad_input(tmp_path):
    (tmp_path / "shard-00000.safetensors").write_bytes(b"")
    with pytest.raises(BadInput) as e:
        Trace(tmp_path)
    assert INDEX in str(e.value) and e.value.fix
    assert e.value.exit_code == 2


def test_trace_with_foreign_schema_is_bad_input(tmp_path):
    (tmp_path / INDEX).write_text('{"schema": "something/else", "run": {}, "steps": [], "calls": []}')
    with pytest.raises(BadInput, match="schema"):
        Trace(tmp_path)


def test_dict_outputs_keep_their_names_and_skip_bookkeeping_kwargs(tmp_path):
    """HF returns a ModelOutput (a dict); the mapper selects ``named:logits`` from it. HF's bookkeeping kwargs
    (attention_mask, position_ids, ...) are not activations and must not be stored as inputs."""
    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = nn.Linear(4, 6)

        def forward(self, x, attention_mask=None, position_ids=None, extra=None):
            return {"logits": self.lm(x), "past_key_values": None, "hidden_states": x * 2}

    torch.manual_seed(0)
    model = DictOut()
    x = torch.randn(1, 3, 4)
    w = TraceWriter(tmp_path, RunInfo("hf", "0", "reference", "m", "float32"))
    ModuleTracer(w, lambda a, k: ([0, 0, 0], [0, 1, 2])).attach(model)
    with torch.no_grad():
        model(x, attention_mask=torch.ones(1, 3), position_ids=torch.arange(3)[None], extra=torch.zeros(2))
    w.close(complete=True)
    trace = Trace(tmp_path)
    root = trace.calls_of("")[0]
    assert root.output_names == ["logits", "hidden_states"]
    assert torch.equal(trace.tensor(root.outputs[0]), model.lm(x).detach())
    assert torch.equal(trace.tensor(root.outputs[1]), x * 2)
    ins = [trace.tensor(r) for r in root.inputs]
    assert len(ins) == 2 and torch.equal(ins[0], x) and torch.equal(ins[1], torch.zeros(2))
    # [1, L, V] with L == rows of the step is a batch of one, not sampled rows
    assert root.rows == "tokens"


def test_store_dtype_converts_floating_tensors_only(tmp_path):
    torch.manual_seed(0)
    model = TinyModel().eval()
    w = TraceWriter(tmp_path, RunInfo("hf", "0", "reference", "tiny", "float32"), store_dtype=torch.bfloat16)
    ModuleTracer(w, lambda a, k: ([0, 0], [0, 1])).attach(model)
    ids = torch.tensor([3, 4])
    with torch.no_grad():
        model(ids, torch.tensor([1]))
    w.close(complete=True)
    trace = Trace(tmp_path)
    emb = trace.calls_of("embed")[0]
    assert emb.inputs[0].dtype == "int64" and torch.equal(trace.tensor(emb.inputs[0]), ids)
    assert emb.outputs[0].dtype == "bfloat16"
    assert torch.equal(trace.tensor(emb.outputs[0]), model.embed.weight[ids].detach().to(torch.bfloat16))


class _InPlaceScale(nn.Module):
    """Like a fused kernel: overwrites its input in place and returns it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2.0)


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.scale = _InPlaceScale()
        self.last = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.scale(self.first(x)))


def test_inputs_are_captured_on_entry_and_shared_with_the_producer(tmp_path):
    torch.manual_seed(0)
    model = _Chain()
    x = torch.randn(3, 4)
    with torch.no_grad():
        first_out = model.first(x)      # by hand, untraced: what `scale` receives before it overwrites it
    trace = _trace_rows(tmp_path, model, x)
    calls = {c.module: c for c in trace.calls}
    scale_in = trace.tensor(calls["scale"].inputs[0])
    assert torch.equal(scale_in, first_out)                      # the value on entry, not the doubled one
    assert torch.equal(trace.tensor(calls["scale"].outputs[0]), first_out * 2)
    # `first`'s output object was handed to `scale` and then overwritten: its copy is not reused for the input…
    assert calls["first"].mutated_after_hook
    # …while `last`'s input, the unchanged output of `scale`, is stored once and shared
    assert calls["last"].inputs[0].key == calls["scale"].outputs[0].key


# ---------------------------------------------------------------------------------------------------------------
# Size control: a token-positions restriction keeps the rows in the set (plus each request's sampled row) and skips
# steps with none of them.

def test_positions_restriction_keeps_rows_in_the_set_and_each_requests_sampled_row(tmp_path):
    from ekka_core.capture.hooks import tracer_for

    torch.manual_seed(0)
    model = TinyModel().eval()
    # Prefill of two requests (lengths 4 and 3), then three decode steps of both.
    layouts = iter([(["a"] * 4 + ["b"] * 3, [0, 1, 2, 3, 0, 1, 2]), (["a", "b"], [4, 3]), (["a", "b"], [5, 4]),
                    (["a", "b"], [6, 5])])
    w = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "tiny", "float32"))
    tracer = tracer_for(w, lambda a, k: next(layouts), {"positions": "1-2,5", "include": ""})
    tracer.attach(model)
    prefill_ids, prefill_last = torch.tensor([3, 5, 7, 1, 2, 4, 6]), torch.tensor([3, 6])
    with torch.no_grad():
        model(prefill_ids, prefill_last)
        for tok in ([4, 5], [6, 7], [8, 9]):
            model(torch.tensor(tok), torch.tensor([0, 1]))
    tracer.resolve_steps({"a": 0, "b": 1}.__getitem__, [4, 3])
    tracer.detach()
    w.close(complete=True)
    expected = _reference_forward(model, prefill_ids, prefill_last)

    trace = Trace(tmp_path)
    assert trace.run.trace_options == {"positions": "1-2,5"}        # the trace says it is restricted
    # Prefill: rows at positions 1 and 2 of both requests, plus each request's last row (a@3, b@2, already in);
    # decode step 1 (positions 4, 3) has no position in the set: skipped; steps 2 and 3 each have one.
    assert [s.phase for s in trace.steps] == ["prefill", "decode:2", "decode:3"]
    assert [list(zip(s.seq, s.pos)) for s in trace.steps] == [[(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)],
                                                             [(0, 5), (1, 4)], [(0, 6), (1, 5)]]
    assert tracer.skipped_steps == 1
    keep = torch.tensor([1, 2, 3, 5, 6])
    for call in (c for c in trace.calls if c.step == 0):
        _, want = expected[call.module]
        got = trace.tensor(call.outputs[0])
        if call.rows == "sampled":       # one row per request, both kept: stored whole
            assert torch.equal(got, want), call.module
        else:                            # token rows: exactly the kept rows, bit-exact
            assert torch.equal(got, want[keep]), call.module
    assert {c.rows for c in trace.calls if c.module == "head" and c.step == 0} == {"sampled"}


def test_positions_restriction_slices_a_reference_batch_of_one_on_its_token_axis(tmp_path):
    from ekka_core.capture.hooks import tracer_for

    class PerHead(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # HF layouts: [1, L, 8] and, per head, [1, heads, L, head_dim]
            return x * 2, x.view(1, x.shape[1], 2, 4).transpose(1, 2)

    x = torch.randn(1, 6, 8)
    w = TraceWriter(tmp_path, RunInfo("hf", "0", "reference", "tiny", "float32"))
    tracer_root = PerHead()
    tracer = tracer_for(w, lambda a, k: ([0] * 6, list(range(6))), {"positions": "2-3"}).attach(tracer_root)
    with torch.no_grad():
        tracer_root(x)
    tracer.resolve_steps(lambda r: r, [4])
    tracer.detach()
    w.close(complete=True)
    trace = Trace(tmp_path)
    assert trace.steps[0].pos == [2, 3, 5]           # positions 2-3 and the sequence's last row
    (call,) = trace.calls
    keep = torch.tensor([2, 3, 5])
    assert torch.equal(trace.tensor(call.outputs[0]), (x * 2)[:, keep])
    assert torch.equal(trace.tensor(call.outputs[1]), x.view(1, 6, 2, 4).transpose(1, 2)[:, :, keep])
    assert torch.equal(trace.tensor(call.inputs[0]), x[:, keep])


def test_positions_option_is_validated_with_a_fix(tmp_path):
    from ekka_core.contracts.spec import DiagnosisSpec

    spec = DiagnosisSpec(model=str(tmp_path), prompts=["p"], trace_positions="4-2")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BadInput, match="trace_positions item '4-2'") as e:
        spec.validate()
    assert "A-B" in e.value.fix
    spec.trace_positions = "0-3,8-"
    assert spec.validate().trace_options()["positions"] == "0-3,8-"


class CallBypassingModel(TinyModel):
    """A root whose class replaces ``nn.Module.__call__`` with one calling ``forward`` directly, as vLLM's
    ``support_torch_compile`` decorator does with compilation off (on ERNIE 4.5's top-level class): its own hooks
    never fire."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def test_a_root_whose_class_bypasses_module_call_still_starts_a_step_at_its_forward(tmp_path):
    torch.manual_seed(0)
    model = CallBypassingModel().eval()
    writer = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "tiny", "float32"))
    tracer = ModuleTracer(writer, lambda args, kwargs: (["a", "a", "a", "b", "b"], [0, 1, 2, 0, 1])).attach(model)
    with torch.no_grad():
        model(torch.tensor([3, 5, 7, 1, 2]), torch.tensor([2, 4]))
    tracer.resolve_steps({"a": 0, "b": 1}.__getitem__, [3, 2])
    tracer.detach()
    writer.close(complete=True)
    assert "forward" not in model.__dict__                   # detached: the class's forward again
    trace = Trace(tmp_path)
    assert [c.module for c in trace.calls] == EXPECTED_ORDER[:-1]   # every module but the root, whose hooks never ran
    assert len(trace.steps) == 1


def test_the_tree_observes_a_residual_added_inside_a_block(tmp_path):
    """TinyModel's decoder layer returns ``down(…) + x``: its output is its last weighted child's plus its input #0;
    the head returns its projection's output as it is."""
    from ekka_core.tree import build_tree

    *_, d = _run(tmp_path)
    tree = build_tree(Trace(d))
    assert tree.modules["layers.0"].adds_input == 0 and tree.modules["layers.1"].adds_input == 0
    assert tree.modules["head"].adds_input == -1
    assert tree.modules["layers.0.up"].adds_input is None       # a leaf holding its own weights: not observed


def test_an_endpoint_subtracting_an_input_gives_the_block_without_its_residual(tmp_path):
    from ekka_core.align.rows import rows_of
    from ekka_core.mapping import Endpoint

    model, ids, last, d = _run(tmp_path)
    expected = _reference_forward(model, ids, last)
    trace = Trace(d)
    rows = rows_of(trace, Endpoint(["layers.0"], minus_input=0))
    assert torch.allclose(rows.matrix, expected["layers.0.down"][1], atol=1e-6)     # down(…) alone
    assert not torch.allclose(rows_of(trace, Endpoint(["layers.0"])).matrix, expected["layers.0.down"][1], atol=1e-3)


# ---------------------------------------------------------------------------------------------------------------
# What is not written twice, and what is not written at all.

class _Attention(nn.Module):
    """Returns (output, probabilities) as HF's eager attention does; the probabilities are [1, heads, L, L]."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.softmax(x.unsqueeze(0).unsqueeze(0) @ x.t().unsqueeze(0).unsqueeze(0), dim=-1)
        return (scores @ x).squeeze(0).squeeze(0), scores.expand(1, 2, -1, -1)


class _Block(nn.Module):
    """A parent returning its last child's output object (HF's LlamaMLP returns down_proj's)."""

    def __init__(self):
        super().__init__()
        self.attn = _Attention()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.attn(x)[0])


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Block(), _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        z = self.b(y)
        y.mul_(0.0)          # after its hooks ran: both calls that returned this object must be flagged
        return z


def _trace_twice(tmp: Path) -> tuple[Trace, torch.Tensor]:
    torch.manual_seed(0)
    model, x = _Twice().eval(), torch.randn(5, 4)
    with torch.no_grad():
        expected = model.a.proj(model.a.attn(x)[0])
    writer = TraceWriter(tmp, RunInfo("hf", "0", "reference", "m", "float32"))
    tracer = ModuleTracer(writer, lambda args, kwargs: ([0] * 5, list(range(5)))).attach(model)
    with torch.no_grad():
        model(x)
    tracer.detach()
    tracer.resolve_steps(lambda r: r, [5])
    writer.close(complete=True)
    return Trace(tmp), expected


def test_a_parent_returning_its_childs_output_shares_the_stored_copy(tmp_path):
    trace, expected = _trace_twice(tmp_path)
    calls = {c.module: c for c in trace.calls}
    assert calls["a"].outputs[0].key == calls["a.proj"].outputs[0].key
    assert torch.equal(trace.tensor(calls["a"].outputs[0]), expected)   # the value at hook time, not the zeros
    assert calls["a"].mutated_after_hook and calls["a.proj"].mutated_after_hook
    assert not calls["b"].mutated_after_hook


def test_attention_probabilities_are_not_stored_and_the_attention_output_is(tmp_path):
    trace, _ = _trace_twice(tmp_path)
    attn = next(c for c in trace.calls if c.module == "a.attn")
    assert isinstance(attn.outputs[0], TensorRef) and attn.outputs[0].shape == [5, 4]
    assert attn.outputs[1] == "attention probabilities [1, 2, 5, 5]: not stored"
    with __import__("safetensors").safe_open(str(next(tmp_path.glob("shard-*.safetensors"))), "pt") as f:
        assert not any(f.get_slice(k).get_shape()[-2:] == [5, 5] for k in f.keys())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_sums_equal_the_sums_written_out_over_several_blocks(monkeypatch, dtype):
    """The blocked, buffer-reusing sums are Σw, Σw², Σ(i+j)·w of the bf16-rounded values, written here as whole-tensor
    float64 expressions; a block of 64 values cuts every tensor (and a [3, 40] one mid-way through its rows)."""
    from ekka_core.capture import hooks

    monkeypatch.setattr(hooks, "_SUM_BLOCK", 64)
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(37, 19, generator=g).to(dtype), torch.randn(3, 40, generator=g).to(dtype),
              torch.randn(50, generator=g).to(dtype) + 1]
    s1 = s2 = order = 0.0
    for p in params:
        w = p.to(torch.bfloat16).double().reshape(p.shape[0], -1)
        i = torch.arange(w.shape[0], dtype=torch.float64)[:, None]
        j = torch.arange(w.shape[1], dtype=torch.float64)[None, :]
        s1, s2, order = s1 + float(w.sum()), s2 + float((w * w).sum()), order + float(((i + j) * w).sum())
    got = hooks.weight_sums(params)
    span = float(sum(sum(p.shape) for p in params))
    assert got[3] == span and got[:3] == pytest.approx([s1, s2, order], rel=1e-12, abs=1e-9)
    # A parameter of more than two dimensions leaves the order out; the first two sums stay.
    stacked = torch.randn(2, 5, 7, generator=g).to(dtype)
    w = stacked.to(torch.bfloat16).double()
    assert hooks.weight_sums([stacked]) == pytest.approx([float(w.sum()), float((w * w).sum())], rel=1e-12)


def test_shard_buffers_pack_any_dtype_and_layout_into_standard_safetensors_shards(tmp_path):
    """Tensors are copied once into a reused shard buffer, packed with no holes (a pad entry where the next element
    size needs one); a tensor larger than a buffer is a shard of its own; every shard is a standard safetensors file
    and every tensor reads back bit for bit, whatever its layout, dtype or size."""
    from safetensors import safe_open

    torch.manual_seed(0)
    base = torch.randn(6, 10)
    tensors = {
        "odd_bool": torch.tensor([True, False, True]),                 # 3 bytes: the next tensor needs a pad
        "bf16_odd": torch.randn(5).to(torch.bfloat16),                 # 10 bytes
        "f32": torch.randn(7, 3),
        "strided": base.t()[2:5],                                      # not contiguous
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "i64": torch.arange(9),
        "big": torch.randn(300),                                       # 1200 bytes: larger than a buffer
        "after_big": torch.randn(4).to(torch.float16),
    }
    w = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "m", "float32"), shard_bytes=256)
    refs = {k: w.add_tensor(k, t) for k, t in tensors.items()}
    w.close(complete=True)
    trace = Trace(tmp_path)
    for k, t in tensors.items():
        got = trace.tensor(refs[k])
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), k
    shards = sorted(tmp_path.glob("shard-*.safetensors"))
    assert len({r.shard for r in refs.values()}) == len(shards) >= 3
    assert refs["big"].shard not in {refs[k].shard for k in tensors if k != "big"}
    for shard in shards:                  # the file safetensors itself validates: no holes, offsets in bounds
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                f.get_tensor(key)
    with safe_open(str(tmp_path / f"shard-{refs['bf16_odd'].shard:05d}.safetensors"), framework="pt") as f:
        assert any(key.startswith("__pad") for key in f.keys())


def test_fp32_tensors_are_stored_over_the_low_precision_trace_within_2e_9_of_the_noise(tmp_path):
    """The fp32 reference's tensors are stored as bf16-rounded differences from the low-precision reference's tensor
    of the same key and module: read back, each is within 2^-9 of that difference (the noise the error ratio divides
    by), at half the bytes; a tensor the base holds for another module, or with another shape, is stored whole; a
    trace whose base went missing says so."""
    from ekka_core.contracts.errors import BadInput
    from ekka_core.contracts.trace_index import ModuleCall

    torch.manual_seed(0)
    y = {"c0.out0": torch.randn(64, 32), "c1.out0": torch.randn(64, 32), "c2.out0": torch.randn(8, 8) * 40}
    x = {k: v.to(torch.bfloat16) for k, v in y.items()}
    x["c2.out0"] = x["c2.out0"][:4]                       # another shape in the base: not a difference
    modules = {"c0.out0": "a", "c1.out0": "b", "c2.out0": "c"}

    def write(directory, tensors, *, dtype, owners, base=None):
        w = TraceWriter(directory, RunInfo("hf", "0", "reference", "m", dtype), delta_base=base)
        for i, (key, t) in enumerate(tensors.items()):
            ref = w.add_tensor(key, t, owners[key])
            w.calls.append(ModuleCall(index=i, step=0, module=owners[key], cls="X", qualname="X", class_file=None,
                                      class_line=None, forward_file=None, forward_line=None, outputs=[ref]))
        w.close(complete=True)

    write(tmp_path / "reference", x, dtype="bfloat16", owners=modules)
    write(tmp_path / "reference-fp32", y, dtype="float32", owners={**modules, "c1.out0": "not-b"},
          base=tmp_path / "reference")
    high, low = Trace(tmp_path / "reference-fp32"), Trace(tmp_path / "reference")
    refs = high.refs_by_key()
    assert refs["c0.out0"].delta_over == "reference" and refs["c0.out0"].dtype == "float32"
    assert refs["c1.out0"].delta_over is None and refs["c2.out0"].delta_over is None
    back = high.tensor(refs["c0.out0"])
    noise = y["c0.out0"] - x["c0.out0"].float()
    assert back.dtype == torch.float32 and bool(((back - y["c0.out0"]).abs() <= noise.abs() * 2**-8).all())
    assert torch.equal(high.tensor(refs["c1.out0"]), y["c1.out0"]) and torch.equal(high.tensor(refs["c2.out0"]), y["c2.out0"])
    assert low.tensor(low.refs_by_key()["c0.out0"]).dtype == torch.bfloat16
    shutil.rmtree(tmp_path / "reference")
    with pytest.raises(BadInput, match="which is missing"):
        Trace(tmp_path / "reference-fp32").tensor(refs["c0.out0"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_two_byte_floats_are_stored_as_a_raw_low_plane_and_a_compressed_high_plane_bit_for_bit(tmp_path, dtype):
    """A bf16/f16 tensor of 4 KB or more is stored as its low bytes and its zstd-compressed high bytes: read back
    bit for bit whatever its values (NaN, ±inf, -0, subnormals) or layout, beside tensors stored whole (which keep
    their alignment after the odd-sized planes), in standard safetensors shards; an activation's narrow exponent
    range makes the plane of high bytes small; a codec this version does not know is refused with a fix."""
    from safetensors import safe_open

    from ekka_core.capture.trace import HIGH_BYTES, SPLIT_MIN_BYTES, split_codec

    torch.manual_seed(0)
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-40, -3e-8, 65504.0])
    activation = (torch.randn(64, 512) * torch.rand(512) * 4).to(dtype)      # per-feature scales, as activations
    tensors = {
        "activation": activation,
        "odd_u8": torch.arange(5, dtype=torch.uint8),                  # 5 bytes after a plane: the next needs a pad
        "strided": torch.randn(96, 48).to(dtype).t(),                  # not contiguous
        "specials": special.to(dtype).repeat(300),
        "f32": torch.randn(33),
        "small": torch.randn(7).to(dtype),                             # under SPLIT_MIN_BYTES: whole
        "i64": torch.arange(11),
    }
    w = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "m", str(dtype)), shard_bytes=1 << 20)
    refs = {k: w.add_tensor(k, t) for k, t in tensors.items()}
    w.close(complete=True)
    trace = Trace(tmp_path)
    for k, t in tensors.items():
        got = trace.tensor(refs[k])
        assert got.dtype == t.dtype and got.shape == t.shape, k
        bits = torch.int16 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype
        assert torch.equal(got.contiguous().view(bits), t.contiguous().view(bits)), k
    split = {k for k, t in tensors.items() if split_codec(t.dtype, t.numel() * t.element_size())}
    assert split == {"activation", "strided", "specials"}
    assert all(refs[k].codec == f"zstd-high-bytes/{str(dtype).removeprefix('torch.')}" for k in split)
    assert all(refs[k].codec is None for k in tensors if k not in split)
    assert activation.numel() * 2 >= SPLIT_MIN_BYTES
    (shard,) = tmp_path.glob("shard-*.safetensors")
    with safe_open(str(shard), framework="pt") as f:     # standard safetensors: every entry loads
        keys = set(f.keys())
        entries = {k: f.get_tensor(k) for k in keys}
    assert {k + HIGH_BYTES for k in split} <= keys
    assert entries["activation"].numel() == activation.numel()            # the low plane, a byte each, raw
    # bf16's high byte is the sign and 7 exponent bits; f16's keeps 2 mantissa bits, which do not compress
    assert entries["activation" + HIGH_BYTES].numel() < activation.numel() * (0.6 if dtype == torch.bfloat16 else 0.85)
    assert entries["f32"].dtype == torch.float32                          # whole, and aligned for its element size
    assert shard.stat().st_size < sum(t.numel() * t.element_size() for t in tensors.values())
    unknown = TensorRef(key="activation", shard=refs["activation"].shard, shape=[64, 512], dtype="bfloat16",
                        codec="lz9-high-bytes/bfloat16")
    with pytest.raises(BadInput, match="codec 'lz9-high-bytes/bfloat16'"):
        trace.tensor(unknown)


class _Heads(nn.Module):
    """q and k split out of one projection's output as views (vLLM's qkv_proj), one of them transposed into heads
    (HF's ``view(...).transpose(1, 2)``), handed to a child; then the projection's output is changed in place and
    handed on again."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 12)
        self.rotary = nn.Identity()
        self.after = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.proj(x)                                           # [3, 12], contiguous
        q, k = qkv[:, :8], qkv[:, 8:]                                # views at offsets 0 and 8
        heads = q.view(3, 2, 4).transpose(0, 1)                      # [2, 3, 4], strides (4, 12, 1)
        self.rotary(heads)
        self.rotary(k)
        qkv.mul_(3.0)                                                # the projection's output overwritten
        return self.after(qkv[:, 8:])                                # a view of a changed output: its own copy


def test_an_input_that_is_a_view_of_an_unchanged_stored_output_is_stored_as_that_view(tmp_path):
    """An input that is a view of an earlier output (q and k out of a fused projection; heads transposed out of it)
    is stored as a view of that output's stored copy — no bytes of its own — and reads back as the view's values;
    once the output was changed in place, a view of it is stored as it is (the value the module received)."""
    torch.manual_seed(0)
    model = _Heads()
    x = torch.randn(3, 4)
    with torch.no_grad():
        qkv = model.proj(x)           # by hand, untraced
    trace = _trace_rows(tmp_path, model, x)
    proj = next(c for c in trace.calls if c.module == "proj").outputs[0]
    heads_in, k_in = (c.inputs[0] for c in trace.calls if c.module == "rotary")
    after_in = next(c for c in trace.calls if c.module == "after").inputs[0]
    assert heads_in.key == k_in.key == proj.key and heads_in.view == [0, [4, 12, 1]] and k_in.view == [8, [12, 1]]
    assert torch.equal(trace.tensor(heads_in), qkv[:, :8].view(3, 2, 4).transpose(0, 1))
    assert torch.equal(trace.tensor(k_in), qkv[:, 8:])
    assert after_in.view is None and torch.equal(trace.tensor(after_in), qkv[:, 8:] * 3.0)
    from safetensors import safe_open
    (shard,) = tmp_path.glob("shard-*.safetensors")
    with safe_open(str(shard), framework="pt") as f:          # the views wrote nothing; the changed one did
        stored = set(f.keys())
    # the inputs stored: the model's and proj's (x) and after's; none for the two rotary calls' views
    assert proj.key in stored and {k for k in stored if ".in" in k} == {"e1.in0", "e2.in0", after_in.key}


class _Mlps(nn.Module):
    """A gated MLP as HF writes it (``down(act(gate(x)) * up(x))``: the activation's output reaches no module), a
    plain one (``fc2(act(fc1(x)))``) and a block that returns its activation child's output."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 4)
        self.gated_act, self.plain_act = nn.SiLU(), nn.GELU()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(self.gated_act(self.gate(x)) * self.up(x))
        h = self.fc2(self.plain_act(self.fc1(h)))
        return self.block(h)


@pytest.mark.parametrize("reference", [True, False])
def test_the_reference_stores_an_activations_output_only_where_a_module_receives_it(tmp_path, reference):
    """The reference's tracer stores a parameter-free leaf's output only once a module receives it (the plain MLP's
    fc2, the block returning it), under the producer's key and shared with the receiver; a gated activation's output,
    multiplied in the MLP's forward, is not stored and says so. A target's tracer stores every output."""
    torch.manual_seed(0)
    model = _Mlps()
    x = torch.randn(3, 4)
    with torch.no_grad():        # by hand, untraced
        gated = torch.nn.functional.silu(model.gate(x))
        h = model.down(gated * model.up(x))
        plain = torch.nn.functional.gelu(model.fc1(h))
        tanh = torch.tanh(model.block[0](model.fc2(plain)))
    trace = _trace_rows(tmp_path, model, x, role="reference" if reference else "target",
                        free_outputs_when_received=reference)
    calls = {c.module: c for c in trace.calls}
    gated_out, plain_out = calls["gated_act"].outputs[0], calls["plain_act"].outputs[0]
    assert isinstance(plain_out, TensorRef) and plain_out.key == f"c{calls['plain_act'].index}.out0"
    assert calls["fc2"].inputs[0] == plain_out and torch.allclose(trace.tensor(plain_out), plain)
    tanh_out = calls["block.1"].outputs[0]
    assert isinstance(tanh_out, TensorRef) and calls["block"].outputs[0] == tanh_out
    assert torch.allclose(trace.tensor(tanh_out), tanh)
    if reference:
        assert isinstance(gated_out, str) and "not stored" in gated_out and "[3, 6]" in gated_out
        assert f"c{calls['gated_act'].index}.out0" not in trace.refs_by_key()
    else:
        assert isinstance(gated_out, TensorRef) and torch.allclose(trace.tensor(gated_out), gated)


def test_without_zstandard_a_writer_stores_tensors_whole_and_a_reader_says_what_to_install(tmp_path, monkeypatch):
    """An engine environment Ekka's code travels to without its dependencies (``--python``, a remote host) writes
    two-byte floats whole, read back the same; a split trace read where zstandard is missing is a bad input naming
    the package."""
    from ekka_core.capture import trace as trace_module

    t = torch.randn(64, 64).to(torch.bfloat16)
    w = TraceWriter(tmp_path / "split", RunInfo("vllm", "0", "target", "m", "bfloat16"))
    split_ref = w.add_tensor("a", t)
    w.close(complete=True)
    monkeypatch.setattr(trace_module, "zstandard", None)
    w = TraceWriter(tmp_path / "whole", RunInfo("vllm", "0", "target", "m", "bfloat16"))
    whole_ref = w.add_tensor("a", t)
    w.close(complete=True)
    assert split_ref.codec is not None and whole_ref.codec is None
    assert torch.equal(Trace(tmp_path / "whole").tensor(whole_ref), t)
    with pytest.raises(BadInput, match="zstandard") as e:
        Trace(tmp_path / "split").tensor(split_ref)
    assert "pip install zstandard" in e.value.fix


def test_a_trace_written_before_the_two_planes_still_reads(tmp_path, monkeypatch):
    """An ``ekka.trace/2`` trace — every tensor whole, its index without ``codec`` or ``view`` — reads back as
    written (traces are kept and reused across Ekka versions)."""
    from ekka_core.capture import trace as trace_module

    monkeypatch.setattr(trace_module, "zstandard", None)      # whole tensors, as /2 wrote them
    t = torch.randn(64, 64).to(torch.bfloat16)
    w = TraceWriter(tmp_path, RunInfo("vllm", "0", "target", "m", "bfloat16"))
    w.calls.append(trace_module.ModuleCall(index=0, step=0, module="m", cls="X", qualname="X", class_file=None,
                                           class_line=None, forward_file=None, forward_line=None,
                                           outputs=[w.add_tensor("c0.out0", t, "m")]))
    w.close(complete=True)
    index = json.loads((tmp_path / INDEX).read_text())
    index["schema"] = "ekka.trace/2"
    for ref in index["calls"][0]["outputs"]:
        del ref["codec"], ref["view"]
    (tmp_path / INDEX).write_text(json.dumps(index))
    monkeypatch.undo()
    trace = Trace(tmp_path)
    (ref,) = trace.calls[0].outputs
    assert ref.codec is None and ref.view is None and torch.equal(trace.tensor(ref), t)
