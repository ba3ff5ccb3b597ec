"""Stage 4 — alignment: put each mapped pair's tensors on the same rows and features, then prove it.

Entry point: :func:`align`. Every aligned tensor is ``[rows, features]`` in fp32 with one row per
(sequence, position) — the target's flat ``[num_tokens, …]`` batches (prefill and decode steps, several requests)
and the reference's ``[1, seq, …]`` teacher-forced passes both end up there.

A pair whose mapping carries an ``aligner`` (code the mapping agent wrote and validated) is aligned by that code,
run in a sandboxed subprocess (:mod:`ekka_core.align.custom`); a failing aligner fails only its pair.

Before anything is compared, :func:`prove_alignment` checks that the three traces describe the same computation:
same token ids, embeddings equal, and layer *i*'s output is layer *i+1*'s input inside each framework. A failed
proof stops the diagnosis with a message naming what did not line up — a wrong alignment would otherwise produce
a confident, wrong diagnosis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from ekka_core.capture.routing import traced_router_ties
from ekka_core.capture.trace import ModuleCall, TensorRef, Trace, token_axis
from ekka_core.contracts.alignment import AlignmentFailure
from ekka_core.contracts.errors import BadInput, InternalFailure
from ekka_core.mapping import ComponentPair, Endpoint, Mapping

Key = tuple[int, int]   # (sequence, position)
# Shard mappings are dropped after this many bytes were read through them: memory stays flat as traces grow.
RELEASE_BYTES = 128 << 20


class AlignmentError(InternalFailure):
    """An aligner's self-check failed: the pair cannot be compared as declared."""


@dataclass
class Traces:
    target: Trace          # X_T: target engine, low precision
    reference: Trace       # X_R: reference, same low precision
    reference_fp32: Trace  # Y_R: reference, fp32


@dataclass
class AlignedPair:
    pair: ComponentPair
    order: int                                   # position in the target's execution order
    keys: list[Key]
    target: torch.Tensor                         # X_T [rows, features]
    reference: torch.Tensor                      # X_R
    reference_fp32: torch.Tensor                 # Y_R
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None   # same, for the inputs


@dataclass
class AlignedPairs:
    """Lazily aligned pairs, in the target's execution order: one pair's tensors in memory at a time."""

    traces: Traces
    mapping: Mapping
    order: dict[str, int] = field(default_factory=dict)
    failures: list[AlignmentFailure] = field(default_factory=list)
    # Tokens whose MoE routing is within numerical noise of a tie: (seq, pos) -> (target order from which they
    # are excluded, why). Either expert choice is a correct low-precision result, and a different choice changes
    # that token's activations entirely — comparing them would report noise as a bug.
    excluded: dict[Key, tuple[int, str]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[AlignedPair]:
        pairs = sorted(self.mapping.pairs, key=lambda p: self.order.get(p.component, 1 << 30))
        for pair in pairs:
            try:
                ap = align_pair(pair, self.traces, self.order.get(pair.component, -1))
            except AlignmentError as e:
                self.failures.append(AlignmentFailure(pair.component, str(e)))
                continue
            yield _drop_excluded(ap, self.excluded)
            for tr in (self.traces.target, self.traces.reference, self.traces.reference_fp32):
                tr.release(above_bytes=RELEASE_BYTES)


def align(mapping: Mapping, traces: Traces) -> AlignedPairs:
    prove_alignment(traces)
    order = {}
    for c in traces.target.calls:
        order.setdefault(c.module, c.index)
    aligned = AlignedPairs(traces, mapping, order)
    aligned.excluded = ambiguous_routing(traces, order)
    return aligned


def _drop_excluded(ap: AlignedPair, excluded: dict[Key, tuple[int, str]]) -> AlignedPair:
    keep = [i for i, k in enumerate(ap.keys) if not (k in excluded and ap.order >= excluded[k][0])]
    if len(keep) == len(ap.keys) or not keep:
        return ap
    idx = torch.tensor(keep)
    ins = None if ap.inputs is None else tuple(t[idx] for t in ap.inputs)
    return AlignedPair(ap.pair, ap.order, [ap.keys[i] for i in keep], ap.target[idx], ap.reference[idx],
                       ap.reference_fp32[idx], ins)  # type: ignore[arg-type]


def ambiguous_routing(traces: Traces, order: dict[str, int]) -> dict[Key, tuple[int, str]]:
    """MoE tokens whose top-k expert choice is decided by less than the reference's own rounding noise.

    The reference router (an HF module named ``gate`` returning logits ``[tokens, experts]`` and the chosen
    expert ids ``[tokens, k]``), in fp32 and in low precision, decides it (:func:`~ekka_core.capture.routing.traced_router_ties`)."""
    out: dict[Key, tuple[int, str]] = {}
    y, x = traces.reference_fp32, traces.reference
    for call, tied, margin, noise in traced_router_ties(x, y):
        block = call.module.rsplit(".", 1)[0]
        start = min((o for m, o in order.items() if m == block or m.startswith(block + ".")), default=0)
        step = y.steps[call.step]
        for row in torch.nonzero(tied).flatten().tolist():
            key = (step.seq[row], step.pos[row])
            if key not in out:
                out[key] = (start, f"{block}: expert routing tie within noise (margin {margin[row]:.2g}, "
                                   f"reference rounding {noise[row]:.2g})")
    return out


# ---------------------------------------------------------------------------------------------------------------
def align_pair(pair: ComponentPair, traces: Traces, order: int = -1) -> AlignedPair:
    """One mapped pair aligned: X_T, X_R, Y_R on the same (sequence, position) rows. ``order`` is the pair's place
    in the target's execution order (-1: unknown). Raises :class:`AlignmentError` when the pair cannot be aligned."""
    _check_declared_split(pair, traces.target)     # static: before any tensor is read
    if pair.aligner:
        # Agent- or user-written code: run in the sandbox, never here (ekka_core.align.custom).
        from ekka_core.align.custom import align_with_aligner
        keys, x_t, x_r, y_r = align_with_aligner(pair, traces)
        return AlignedPair(pair, order, keys, x_t, x_r, y_r)
    t_rows = rows_of(traces.target, pair.target)
    keys = sorted(t_rows.index)
    if not keys:
        raise AlignmentError(f"{pair.component}: the target trace has no rows for it")
    sides = [t_rows]
    restricted = positions_restricted(traces)
    for tr in (traces.reference, traces.reference_fp32):
        rows = rows_of(tr, pair.reference)
        missing = [k for k in keys if k not in rows.index]
        if missing and restricted:
            keys = [k for k in keys if k in rows.index]
            missing = [] if keys else missing
        if missing:
            raise AlignmentError(f"{pair.component} ↔ {', '.join(pair.reference.modules)}: the reference has no "
                                 f"rows for (sequence, position) {missing[:3]}")
        sides.append(rows)
    x_t, x_r, y_r = (s.take(keys) for s in sides)
    if x_t.shape != x_r.shape:
        raise AlignmentError(f"{pair.component} ↔ {', '.join(pair.reference.modules)}: shapes differ after "
                             f"alignment, target {list(x_t.shape)} vs reference {list(x_r.shape)}")
    inputs = None
    if pair.compare_inputs:
        try:
            ins = [rows_of(tr, Endpoint(ep.modules, port="input", select=pair.input_select))
                   for tr, ep in ((traces.target, pair.target), (traces.reference, pair.reference),
                                  (traces.reference_fp32, pair.reference))]
            i_t, i_r, i_y = (s.take(keys) for s in ins)
            if i_t.shape == i_r.shape:
                inputs = (i_t, i_r, i_y)
        except (KeyError, AlignmentError, RuntimeError):
            inputs = None  # inputs are a bonus for local blame; the outputs are what is compared
    return AlignedPair(pair, order, keys, x_t, x_r, y_r, inputs)


def positions_restricted(traces: Traces) -> bool:
    """Traces restricted to some token positions keep the rows in the set on both sides, plus the rows where each
    side sampled — those differ, so only the rows both kept are compared."""
    return any(tr.run.trace_options.get("positions") for tr in (traces.target, traces.reference))


def _check_declared_split(pair: ComponentPair, target: Trace) -> None:
    """Self-check for 1:N pairs: the reference parts must line up with the blocks the engine declares for its
    fused module (vLLM's QKVParallelLinear is [q | k | v] with GQA widths). A swapped or mis-sized split is an
    alignment error, never a comparison."""
    sizes = pair.reference.split_sizes
    layout = target.run.declared.get("tp_layout", {}).get(pair.target.modules[0])
    if not sizes or not layout or len(layout["blocks"]) != len(sizes):
        return
    if list(layout["blocks"]) != list(sizes):
        raise AlignmentError(f"{pair.component} ↔ {', '.join(pair.reference.modules)}: the reference parts have "
                             f"widths {list(sizes)} but the engine declares its fused output as blocks "
                             f"{list(layout['blocks'])}; the split order or sizes are wrong")


def _scaled(matrix: torch.Tensor, scale: float, dtype: str) -> torch.Tensor:
    """The constant the other side folds into its own module (Gemma's embedding normaliser), applied as the engine
    applies it in its parent's forward: in the run's dtype, the constant rounded to it, the product rounded once.
    Applied in fp32 instead, a correct engine would look a rounding away from the reference."""
    low = getattr(torch, dtype.removeprefix("torch."), torch.float32)
    return (matrix.to(low) * torch.tensor(scale, dtype=low)).float()


@dataclass
class Rows:
    """One endpoint's rows: a [rows, features] matrix and which (sequence, position) each row is."""

    index: dict[Key, int]
    matrix: torch.Tensor

    def take(self, keys: list[Key]) -> torch.Tensor:
        return self.matrix.index_select(0, torch.tensor([self.index[k] for k in keys], dtype=torch.long))


def rows_of(trace: Trace, ep: Endpoint) -> Rows:
    """Rows of one endpoint, keyed by (sequence, position); 1:N endpoints concatenated along features. Each call's
    tensor becomes one block of rows (one per token, or one per sequence for a call that holds only the sampled
    rows); blocks are concatenated once (a later call for the same key wins)."""
    parts: list[Rows] = []
    for module in ep.modules:
        keys_all: list[Key] = []
        blocks: list[torch.Tensor] = []
        for call in trace.calls_of(module):
            step = trace.steps[call.step]
            if ep.select == "all" and call.rows == "tokens":
                keys = list(zip(step.seq, step.pos))
                outs = [trace.tensor(r).float() for r in (call.outputs if ep.port == "output" else call.inputs)
                        if isinstance(r, TensorRef) and is_float(r)]
                flat = torch.cat([_token_rows(t, len(keys), call.module) for t in outs], dim=1)
            else:
                tensor = _select(trace, call, ep)
                if tensor is None:
                    continue
                if call.rows == "sampled":
                    last: dict[int, int] = {}
                    for s, p in zip(step.seq, step.pos):
                        if s >= 0:
                            last[s] = max(p, last.get(s, -1))
                    keys = list(last.items())
                    flat = tensor.reshape(tensor.shape[0], -1)
                else:
                    keys = list(zip(step.seq, step.pos))
                    flat = _token_rows(tensor, len(keys), call.module)
            keys_all.extend(keys)
            blocks.append(flat)
        if not blocks:
            parts.append(Rows({}, torch.empty(0, 0)))
            continue
        widths = sorted({b.shape[1] for b in blocks})
        if len(widths) != 1:
            raise AlignmentError(f"{module}: its {ep.port} rows have different widths across calls {widths}")
        index = {k: i for i, k in enumerate(keys_all) if k[0] >= 0}
        matrix = torch.cat(blocks)
        parts.append(Rows(index, _scaled(matrix, ep.scale, trace.run.dtype) if ep.scale is not None else matrix))
    if len(parts) == 1:
        return parts[0]
    common = sorted(set(parts[0].index).intersection(*(p.index for p in parts[1:])))
    if not common:
        return Rows({}, torch.empty(0, 0))
    return Rows({k: i for i, k in enumerate(common)}, torch.cat([p.take(common) for p in parts], dim=1))


def gather_rows(trace: Trace, ep: Endpoint) -> dict[Key, torch.Tensor]:
    """:func:`rows_of` as a dict (sequence, position) → row: what the agent's tools and the proofs read."""
    r = rows_of(trace, ep)
    return {k: r.matrix[i] for k, i in r.index.items()}


def _select(trace: Trace, call: ModuleCall, ep: Endpoint) -> torch.Tensor | None:
    refs = call.outputs if ep.port == "output" else call.inputs
    if ep.select.startswith("named:"):
        name = ep.select.split(":", 1)[1]
        if name not in call.output_names:
            return None
        ref = refs[call.output_names.index(name)]
        return trace.tensor(ref).float() if isinstance(ref, TensorRef) else None
    tensors = [r for r in refs if isinstance(r, TensorRef) and is_float(r)]
    if not tensors:
        return None
    first = trace.tensor(tensors[0]).float()
    if ep.select == "stream":
        # vLLM's residual stream travels as (hidden, residual): their sum is HF's single hidden state.
        for r in tensors[1:2]:
            if r.shape == tensors[0].shape:
                first = first + trace.tensor(r).float()
    return first


def is_float(ref: TensorRef) -> bool:
    """A floating-point tensor (activations); ids, masks and routing choices are not."""
    return ref.is_float


def _token_rows(t: torch.Tensor, n: int, module: str) -> torch.Tensor:
    """[n, …] (flat engine batch) or [1, …, n, …] (a reference batch of one) → [n, features]."""
    axis = token_axis(list(t.shape), n)
    if axis == 0:
        return t.reshape(n, -1)
    if axis is not None:
        # HF layouts put tokens second-to-last: [1, L, hidden] and, per head, [1, heads, L, head_dim].
        return t[0].movedim(axis - 1, 0).reshape(n, -1)
    raise AlignmentError(f"{module}: cannot find the token axis of a {list(t.shape)} tensor for {n} tokens")


# ---------------------------------------------------------------------------------------------------------------
def prove_alignment(traces: Traces) -> None:
    t, r, y = traces.target, traces.reference, traces.reference_fp32
    for tr in (t, r, y):
        if not tr.run.complete:
            raise BadInput(f"trace {tr.dir} is incomplete ({tr.run.failure or 'cut short'})",
                           fix="re-run the capture (`--fresh`); the partial trace is kept for inspection")
    if r.run.model != t.run.model or y.run.model != t.run.model:
        raise BadInput(f"the traces are of different models: target {t.run.model}, reference {r.run.model}, "
                       f"fp32 reference {y.run.model}", fix="capture all three runs from the same model")
    for name, other in (("reference", r), ("fp32 reference", y)):
        if len(other.run.token_ids) != len(t.run.token_ids):
            raise BadInput(f"the target ran {len(t.run.token_ids)} sequences, the {name} "
                           f"{len(other.run.token_ids)}", fix="capture all runs from the same prompts")
        for i, (a, b) in enumerate(zip(t.run.token_ids, other.run.token_ids)):
            if a != b:
                at = next((j for j, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
                raise BadInput(f"sequence {i}: the {name} was fed different tokens than the target from position "
                               f"{at} (lengths {len(b)} vs {len(a)})",
                               fix="teacher-force the reference on the target's tokens (re-run with --fresh)")
    _prove_embeddings_equal(t, r)
    for tr in (t, r):
        _prove_layer_chain(tr)


def _first_output(trace: Trace, module: str) -> Rows | None:
    if not trace.calls_of(module):
        return None
    return rows_of(trace, Endpoint([module]))


def _prove_embeddings_equal(t: Trace, r: Trace) -> None:
    """An embedding lookup is a copy: the same token ids must give the same rows (up to the normaliser some
    engines fold into the parent's forward, and one rounding of it)."""
    name = next((c.module for c in t.calls if c.module.endswith("embed_tokens")), None)
    if name is None:
        return
    a, b = _first_output(t, name), _first_output(r, name)
    if a is None or b is None:
        return
    scale = t.run.declared.get("embedding_normalizer")
    # The rows both traces hold (all of them, unless the capture was restricted to some token positions).
    common = sorted(set(a.index) & set(b.index))
    ta, tb = a.take(common), b.take(common)
    if tb.shape != ta.shape:
        raise BadInput(f"embeddings have different shapes: target {list(ta.shape)}, reference {list(tb.shape)}",
                       fix="the traces are of different models; capture both from the same checkpoint")
    if scale and not torch.allclose(ta, tb, rtol=1e-2, atol=1e-6):
        ta = ta * scale
    err = (ta - tb).norm() / tb.norm().clamp_min(1e-12)
    if err > 2e-2:
        raise BadInput(f"embedding proof failed: {name} differs between target and reference on the same token "
                       f"ids (relative difference {err:.3g})",
                       fix="the traces are of different models or different weights; capture both from one checkpoint")


def _prove_layer_chain(trace: Trace) -> None:
    """Within one framework, layer i's output is layer i+1's input: checks the stream reconstruction."""
    layers = sorted({c.module for c in trace.calls if c.module.rsplit(".", 1)[-1].isdigit()
                     and c.cls.endswith("DecoderLayer")}, key=lambda m: int(m.rsplit(".", 1)[-1]))
    for a, b in zip(layers, layers[1:]):
        out = gather_rows(trace, Endpoint([a], select="stream"))
        inp = gather_rows(trace, Endpoint([b], port="input", select="stream"))
        keys = sorted(set(out) & set(inp))
        if not keys:
            continue
        o = torch.stack([out[k] for k in keys])
        i = torch.stack([inp[k] for k in keys])
        err = (o - i).norm() / i.norm().clamp_min(1e-12)
        if err > 1e-2:
            raise AlignmentError(f"alignment proof failed in the {trace.run.framework} trace: the output of {a} "
                                 f"is not the input of {b} (relative difference {err:.3g}); the residual stream "
                                 f"is not reconstructed correctly for this architecture")
