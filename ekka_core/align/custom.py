"""Custom aligners in the align stage: the inputs an aligner sees, and the rows it gives a mapped pair.

A pair whose ``aligner`` holds source code (written by the mapping agent, or a user, to the fixed template of
:mod:`ekka_core.align.template`) is aligned by that code instead of the built-in gatherer. The code is untrusted: it
runs only in the sandbox (:func:`ekka_core.align.sandbox.run_aligner_jobs`), never in this process.

An aligner sees **one sequence at a time** (:func:`aligner_inputs`):

* target tensors ``out0``, ``out1``… / ``in0``…: every call of the component that computed rows of that sequence
  (the prefill and each decode step, whatever else was batched with it), cut to that sequence's rows and
  concatenated in call order; a tensor without a token axis is passed as the first call had it;
* reference tensors (``out0``… for one module; ``m0.out0``, ``m1.out0``… for several): for each module, its call
  that computed every one of those positions, cut along its token axis to them, in the same order;
* ``meta``: ``rows``, ``positions``, ``sequence``, ``target_module``, ``reference_modules``, ``split_sizes`` when
  the pair declares them, and the shapes.

Row r of both returned arrays is then (sequence, positions[r]). The agent's ``propose_aligner`` tool runs the
aligner on exactly these inputs for one sequence; the align stage (:func:`align_with_aligner`) runs it for every
sequence, against the low-precision reference (X_R) and the fp32 reference (Y_R), in one sandboxed child per pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ekka_core.align import AlignmentError, Key, Traces, is_float, positions_restricted
from ekka_core.capture.trace import TensorRef, Trace, token_axis
from ekka_core.mapping import ComponentPair

# One sandboxed child aligns one pair (every sequence, both reference runs): its wall-clock limit.
ALIGNER_TIMEOUT_S = 60.0


@dataclass
class AlignerInputs:
    target: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    meta: dict[str, Any]


def aligner_inputs(target: Trace, reference: Trace, component: str, reference_modules: list[str],
                   sequence: int | None = None, split_sizes: list[int] | None = None) -> AlignerInputs:
    """The named tensors and meta of one sequence for an aligner (see the module docstring). ``sequence`` None:
    the first sequence the component's first prefill call computed."""
    if sequence is None:
        sequence = _first_sequence(target, component)
    t_in, positions = target_inputs(target, component, sequence)
    r_in = reference_inputs(reference, reference_modules, sequence, positions)
    return AlignerInputs(t_in, r_in, aligner_meta(component, reference_modules, sequence, positions, split_sizes))


def aligner_meta(component: str, reference_modules: list[str], sequence: int, positions: list[int],
                 split_sizes: list[int] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"rows": len(positions), "num_tokens": len(positions), "positions": positions,
                            "sequence": sequence, "target_module": component,
                            "reference_modules": list(reference_modules)}
    if split_sizes:
        meta["split_sizes"] = list(split_sizes)
    return meta


def target_inputs(trace: Trace, component: str, sequence: int, keep: set[int] | None = None
                  ) -> tuple[dict[str, np.ndarray], list[int]]:
    """The component's tensors for one sequence over all its calls, and the position of each row (only positions
    in ``keep`` when given)."""
    calls = trace.calls_of(component)
    if not calls:
        raise AlignmentError(f"{component} did not run in the {trace.run.framework} trace")
    positions: list[int] = []
    token_parts: dict[str, list[np.ndarray]] = {}
    whole: dict[str, np.ndarray] = {}            # tensors without a token axis: as the first call had them
    for call in calls:
        step = trace.steps[call.step]
        rows = [j for j, s in enumerate(step.seq) if s == sequence and (keep is None or step.pos[j] in keep)]
        if not rows:
            continue
        if call.rows == "sampled":
            raise AlignmentError(f"{component}: its tensors have one row per sequence (sampled logits), not one "
                                 "per token; custom aligners work on per-token tensors")
        positions += [step.pos[j] for j in rows]
        for name, ref in _float_tensors(call):
            a = trace.tensor(ref).float().numpy()
            if a.ndim >= 1 and a.shape[0] == len(step.seq) and name not in whole:
                token_parts.setdefault(name, []).append(a[rows])
            else:
                whole.setdefault(name, a)
                token_parts.pop(name, None)
    if not positions:
        raise AlignmentError(f"{component}: no call computed rows of sequence {sequence}")
    tensors = dict(whole)
    for name, parts in token_parts.items():
        if len({p.shape[1:] for p in parts}) != 1:
            raise AlignmentError(f"{component}: {name} has different shapes across calls "
                                 f"{sorted({tuple(p.shape) for p in parts})}; cannot stack its rows")
        tensors[name] = np.ascontiguousarray(np.concatenate(parts))
    return tensors, positions


def reference_inputs(trace: Trace, modules: list[str], sequence: int, positions: list[int]
                     ) -> dict[str, np.ndarray]:
    """Each reference module's tensors at (sequence, positions), cut along the token axis in that order."""
    tensors: dict[str, np.ndarray] = {}
    for j, module in enumerate(modules):
        calls = trace.calls_of(module)
        if not calls:
            raise AlignmentError(f"{module} did not run in the {trace.run.framework} trace")
        call, where = None, {}
        for c in calls:
            step = trace.steps[c.step]
            where = {(s, p): n for n, (s, p) in enumerate(zip(step.seq, step.pos))}
            if all((sequence, p) in where for p in positions):
                call = c
                break
        if call is None:
            raise AlignmentError(f"{module}: no call computed sequence {sequence} at every position the target did "
                                 f"(positions {positions[0]}…{positions[-1]})")
        idx = [where[(sequence, p)] for p in positions]
        n = len(trace.steps[call.step].pos)
        prefix = "" if len(modules) == 1 else f"m{j}."
        for name, ref in _float_tensors(call):
            a = trace.tensor(ref).float().numpy()
            axis = token_axis(list(a.shape), n)
            if axis is not None:
                a = np.take(a, idx, axis=axis)
            tensors[prefix + name] = np.ascontiguousarray(a)
    return tensors


def align_with_aligner(pair: ComponentPair, traces: Traces, *, timeout_s: float = ALIGNER_TIMEOUT_S
                       ) -> tuple[list[Key], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and X_T, X_R, Y_R rows ``[rows, features]`` of a pair with an ``aligner``: one sandboxed child runs it
    on every sequence against both reference runs. Raises :class:`AlignmentError` when the aligner fails, breaks
    its contract, or gives target rows that depend on which reference it was handed."""
    from ekka_core.align.sandbox import AlignerJob, run_aligner_jobs

    assert pair.aligner, "align_with_aligner needs a pair with an aligner"
    comp, refs = pair.component, pair.reference.modules
    target = traces.target
    sequences = sorted({s for c in target.calls_of(comp) for s in target.steps[c.step].seq if s >= 0})
    if not sequences:
        raise AlignmentError(f"{comp}: the target trace has no rows for it")
    jobs: list[AlignerJob] = []
    all_keys: list[Key] = []
    restricted = positions_restricted(traces)
    for s in sequences:
        keep = _reference_positions(traces.reference, refs, s) if restricted else None
        try:
            t_in, positions = target_inputs(target, comp, s, keep)
        except AlignmentError:
            if restricted:
                continue                         # no position of this sequence kept on both sides
            raise
        meta = aligner_meta(comp, refs, s, positions, pair.reference.split_sizes)
        for label, trace in (("reference", traces.reference), ("fp32 reference", traces.reference_fp32)):
            r_in = reference_inputs(trace, refs, s, positions)
            jobs.append(AlignerJob(t_in, r_in, meta, label=f"{comp}: sequence {s} against the {label}"))
        all_keys += [(s, p) for p in positions]
    # Only the contract checks (shape, finite): the declared fingerprints were proven when the aligner was
    # accepted; here the target may be the buggy side, and a mismatch would be the bug, not the alignment.
    try:
        results = run_aligner_jobs(pair.aligner, jobs, timeout_s=timeout_s, declared=False)
    except AlignmentError as e:
        raise AlignmentError(f"{comp}: custom aligner failed: {e.message}", fix=e.fix) from None
    if not jobs:
        raise AlignmentError(f"{comp}: the target and the reference kept no common token positions")
    x_t, x_r, y_r = [], [], []
    for low, fp32 in zip(results[0::2], results[1::2]):
        if not np.array_equal(low.target, fp32.target):
            raise AlignmentError(f"{comp}: the custom aligner's target rows change with the reference it is given; "
                                 "the target side must depend on the target tensors only")
        x_t.append(low.target)
        x_r.append(low.reference)
        y_r.append(fp32.reference)
    if len({a.shape[1] for a in x_t}) != 1:
        raise AlignmentError(f"{comp}: the custom aligner returned a different width for each sequence "
                             f"({sorted({a.shape[1] for a in x_t})})")
    index = {k: i for i, k in enumerate(all_keys)}             # a later call for the same key wins
    keys = sorted(index)
    take = torch.tensor([index[k] for k in keys], dtype=torch.long)
    sides = [torch.from_numpy(np.concatenate(parts)).index_select(0, take) for parts in (x_t, x_r, y_r)]
    t_scale, r_scale = pair.target.scale, pair.reference.scale
    if t_scale is not None:
        sides[0] = sides[0] * t_scale
    if r_scale is not None:
        sides[1], sides[2] = sides[1] * r_scale, sides[2] * r_scale
    return keys, sides[0], sides[1], sides[2]


def _reference_positions(trace: Trace, modules: list[str], sequence: int) -> set[int]:
    """Positions of ``sequence`` that every reference module has rows for (a positions-restricted trace)."""
    have = [{p for c in trace.calls_of(m) for s, p in zip(trace.steps[c.step].seq, trace.steps[c.step].pos)
             if s == sequence} for m in modules]
    return set.intersection(*have) if have else set()


def _first_sequence(trace: Trace, component: str) -> int:
    calls = trace.calls_of(component)
    if not calls:
        raise AlignmentError(f"{component} did not run in the {trace.run.framework} trace")
    call = next((c for c in calls if trace.steps[c.step].phase.startswith("prefill")), calls[0])
    seq = next((s for s in trace.steps[call.step].seq if s >= 0), None)
    if seq is None:
        raise AlignmentError(f"{component}: its first call has no rows of a known sequence")
    return seq


def _float_tensors(call: Any) -> list[tuple[str, TensorRef]]:
    """``(name, ref)`` of a call's float tensors: ``out<k>`` for outputs, ``in<k>`` for inputs (k: the position
    among all outputs / inputs, so the names stay stable when a non-tensor sits in between)."""
    return [(f"{kind}{k}", ref) for kind, refs in (("out", call.outputs), ("in", call.inputs))
            for k, ref in enumerate(refs) if isinstance(ref, TensorRef) and is_float(ref)]
