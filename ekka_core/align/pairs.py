"""The aligned pairs: :func:`align` (the stage's entry), :func:`align_pair` (one mapped pair, built in or by its
aligner), and the MoE tokens left out of the comparison because their routing is a tie within noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from ekka_core.align.proof import prove_alignment
from ekka_core.align.rows import rows_of
from ekka_core.align.traces import AlignmentError, Key, Traces, positions_restricted
from ekka_core.capture.routing import traced_router_ties
from ekka_core.capture.trace import Trace
from ekka_core.contracts.alignment import AlignmentFailure
from ekka_core.mapping import ComponentPair, Endpoint, Mapping

# Shard mappings are dropped after this many bytes were read through them: memory stays flat as traces grow.
RELEASE_BYTES = 128 << 20


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
    # Pairs left with no row once those are out (the logits of a sequence tied in its prompt): not compared.
    tied_out: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[AlignedPair]:
        pairs = sorted(self.mapping.pairs, key=lambda p: self.order.get(p.component, 1 << 30))
        for pair in pairs:
            try:
                ap = align_pair(pair, self.traces, self.order.get(pair.component, -1))
            except AlignmentError as e:
                self.failures.append(AlignmentFailure(pair.component, str(e)))
                continue
            kept = _drop_excluded(ap, self.excluded)
            if kept is None:
                self.tied_out.append(pair.component)
            else:
                yield kept
            for tr in (self.traces.target, self.traces.reference, self.traces.reference_fp32):
                tr.release(above_bytes=RELEASE_BYTES)


def align(mapping: Mapping, traces: Traces) -> AlignedPairs:
    prove_alignment(traces)
    if traces.target.embedding_scale is not None:
        name, factor = traces.target.embedding_scale
        pair = mapping.pair(name)
        if pair is not None and pair.target.scale is None:
            pair.target.scale, pair.compare_inputs = factor, False
            pair.rule += f" (engine multiplies the embedding by {factor:.4g} in the parent's forward: measured)"
    order = {}
    for c in traces.target.calls:
        order.setdefault(c.module, c.index)
    aligned = AlignedPairs(traces, mapping, order)
    aligned.excluded = ambiguous_routing(traces, order)
    return aligned


def _drop_excluded(ap: AlignedPair, excluded: dict[Key, tuple[int, str]]) -> AlignedPair | None:
    """The pair without the rows at or after a routing tie of their sequence, at a module from that MoE block on: a
    correct engine may route the tied token elsewhere, and attention carries that token to every later position of
    its sequence (measured: OLMoE's clean logits 3.1× over the noise on the rows after a layer-0 tie, with every tied
    row itself left out). None when no row is left."""
    ties: dict[int, list[tuple[int, int]]] = {}
    for (seq, pos), (start, _why) in excluded.items():
        ties.setdefault(seq, []).append((pos, start))
    keep = [i for i, (seq, pos) in enumerate(ap.keys)
            if not any(p0 <= pos and start <= ap.order for p0, start in ties.get(seq, ()))]
    if not keep and ap.keys:
        return None
    if len(keep) == len(ap.keys):
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
