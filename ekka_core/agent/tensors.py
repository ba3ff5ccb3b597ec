"""Tensor fingerprints for the agent: ``get_tensor_sum`` and ``infer_tensor_match``.

Rows are gathered exactly as the align stage gathers them (:func:`ekka_core.align.gather_rows`): one row per (sequence,
position), the target's flat prefill/decode batches and the reference's ``[1, seq, …]`` passes put on the same
keys. ``infer_tensor_match`` then compares the target's rows with candidate arrangements of the reference's rows —
identity, a constant scale, the concatenation of several modules in every order, a contiguous feature slice of
either side, a permutation of features — and ranks them by relative L2 error on (a sample of) the common rows.

Both sides are the *low-precision* runs (target X_T, reference X_R), so a correct match shows a relative error of
the order of the dtype's rounding (bf16 ≈ 1e-2), and a buggy component may fail to match although the mapping is
right: the cosine similarity is reported alongside to tell the two apart.
"""

from __future__ import annotations

import difflib
import itertools
import math
from typing import Any

import numpy as np

from ekka_core.align import AlignmentError, gather_rows, is_float
from ekka_core.capture.trace import TensorRef, Trace
from ekka_core.mapping import Endpoint

Key = tuple[int, int]
MAX_ROWS = 64                 # rows compared (evenly sampled from the common keys)
MAX_OFFSETS = 4096            # slice offsets tried per search
MAX_PERMUTE = 5               # concatenation orders are tried exhaustively up to this many modules
MAX_PERMUTATION_WIDTH = 16384
# An order of a 1:N concatenation whose relative error is below this fraction of the proposed order's is clearly
# the better one, even when neither matches (a bug upstream perturbs every layer after it: correct ≈ 0.7–0.97,
# swapped ≈ √2, the error of unrelated rows; orders of equally unrelated rows differ by ~1 %).
CLEARLY_BETTER = 0.8


class ToolError(Exception):
    """A tool could not do what was asked; the message goes back to the model as a tool error."""


def module_calls(trace: Trace, module: str, framework: str) -> list[Any]:
    calls = trace.calls_of(module)
    if not calls:
        names = sorted({c.module for c in trace.calls})
        near = difflib.get_close_matches(module, names, n=5, cutoff=0.5)
        raise ToolError(f"module {module!r} did not run in the {framework} trace"
                        + (f"; close names: {', '.join(near)}" if near else ""))
    return calls


def selects_for(trace: Trace, module: str, port: str) -> list[str]:
    """``first`` always; ``stream`` when the first call has two same-shaped float tensors (vLLM's (hidden,
    residual)); ``all`` when it has several float tensors."""
    calls = trace.calls_of(module)
    if not calls:
        return []
    refs = [r for r in (calls[0].outputs if port == "output" else calls[0].inputs)
            if isinstance(r, TensorRef) and is_float(r)]
    out = ["first"]
    if len(refs) >= 2 and refs[0].shape == refs[1].shape:
        out.append("stream")
    if len(refs) >= 2:
        out.append("all")
    return out


def endpoint_rows(trace: Trace, module: str, port: str = "output", select: str = "first"
                  ) -> tuple[list[Key], np.ndarray] | None:
    """``(keys, [rows, features] float64)`` for one module, as the align stage would gather it; None when there is
    no float tensor at that port."""
    try:
        rows = gather_rows(trace, Endpoint([module], port=port, select=select))
    except (AlignmentError, RuntimeError, ValueError) as e:
        raise ToolError(f"{module}: cannot put its {port} on (sequence, position) rows: {e}") from None
    if not rows:
        return None
    keys = sorted(rows)
    return keys, np.stack([rows[k].double().numpy().reshape(-1) for k in keys])


def tensor_sum(trace: Trace, module: str, port: str, framework: str, max_tokens: int = 12) -> dict[str, Any]:
    calls = module_calls(trace, module, framework)
    first = calls[0]
    refs = first.outputs if port == "output" else first.inputs
    tensors = []
    for i, r in enumerate(refs):
        if isinstance(r, TensorRef):
            t = trace.tensor(r)
            entry: dict[str, Any] = {"index": i, "shape": list(r.shape), "dtype": r.dtype}
            if t.is_floating_point():
                entry["sum"] = _num(t.double().sum().item())
            tensors.append(entry)
        else:
            tensors.append({"index": i, "value": r})
    out: dict[str, Any] = {"framework": framework, "module": module, "class": first.cls, "port": port,
                           "calls": len(calls), "phases": sorted({trace.steps[c.step].phase.split(":")[0]
                                                                  for c in calls}),
                           "first_call_tensors": tensors}
    for select in selects_for(trace, module, port):
        got = endpoint_rows(trace, module, port, select)
        if got is None:
            continue
        keys, a = got
        sums = a.sum(axis=1)
        out[f"rows[{select}]"] = {
            "rows": len(keys), "features": int(a.shape[1]), "sum": _num(a.sum()), "l2": _num(np.linalg.norm(a)),
            "mean_abs": _num(np.abs(a).mean()),
            "per_token_sums": [[s, p, _num(v)] for (s, p), v in list(zip(keys, sums))[:max_tokens]],
            "first_row_head": [_num(v) for v in a[0, :8]],
        }
    if not any(k.startswith("rows[") for k in out):
        out["note"] = f"no float tensor at the {port}"
    return out


def _num(x: float) -> float:
    x = float(x)
    return x if not math.isfinite(x) else float(f"{x:.6g}")


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    nb = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / (nb if nb > 0 else 1e-30)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float((a * b).sum()) / (na * nb) if na > 0 and nb > 0 else 0.0


def _fingerprint(a: np.ndarray) -> np.ndarray:
    """Two numbers per feature: its plain sum over rows and a fixed random weighting of the rows."""
    w = np.random.default_rng(0).standard_normal(a.shape[0])
    return np.stack([a.sum(axis=0), w @ a])


def _offsets(big: int, small: int) -> list[int]:
    n = big - small + 1
    for step in (1, math.gcd(big, small), 64, small, max(1, math.ceil(n / MAX_OFFSETS))):
        offs = list(range(0, n, max(1, step)))
        if len(offs) <= MAX_OFFSETS:
            if n - 1 not in offs:
                offs.append(n - 1)
            return offs
    return list(range(0, n, math.ceil(n / MAX_OFFSETS)))


def find_slices(big: np.ndarray, small: np.ndarray, top: int = 3) -> list[tuple[int, float]]:
    """Offsets ``a`` where ``big[:, a:a+w]`` best matches ``small`` (``w`` its width), verified on the full rows."""
    w = small.shape[1]
    fb, fs = _fingerprint(big), _fingerprint(small)
    scale = float(np.linalg.norm(fs)) or 1.0
    scored = sorted((float(np.linalg.norm(fb[:, a:a + w] - fs)) / scale, a) for a in _offsets(big.shape[1], w))
    return sorted(((a, _rel(big[:, a:a + w], small)) for _, a in scored[:top]), key=lambda x: x[1])


def _runs(perm: np.ndarray) -> list[list[int]]:
    """A permutation ``target[:, perm[j]] ↔ reference[:, j]`` as contiguous runs
    [target_start, reference_start, length]."""
    runs: list[list[int]] = []
    for j, t in enumerate(perm.tolist()):
        if runs and runs[-1][0] + runs[-1][2] == t and runs[-1][1] + runs[-1][2] == j:
            runs[-1][2] += 1
        else:
            runs.append([t, j, 1])
    return runs


def _candidates(t: np.ndarray, refs: list[np.ndarray], names: list[str], tol: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    wt = t.shape[1]
    widths = [r.shape[1] for r in refs]

    def add(kind: str, rel: float, cos: float, **extra: Any) -> None:
        out.append({"kind": kind, "rel_err": _num(rel), "cosine": _num(cos), **extra})

    if len(refs) == 1:
        r = refs[0]
        if wt == widths[0]:
            rel = _rel(t, r)
            add("identity", rel, _cos(t, r), relation="1:1", reference_modules=names)
            rr = float((r * r).sum())
            if rr > 0 and rel > tol:
                alpha = float((t * r).sum()) / rr            # t ≈ alpha · r  ⇒  t · (1/alpha) ≈ r
                if alpha != 0 and abs(alpha - 1) > tol:
                    add("scaled", _rel(t / alpha, r), _cos(t, r), relation="1:1", reference_modules=names,
                        scale=_num(1 / alpha), note="target × scale ≈ reference (Endpoint.scale on the target)")
            if rel > tol and wt <= MAX_PERMUTATION_WIDTH and wt > 1:
                ft, fr = _fingerprint(t)[1], _fingerprint(r)[1]
                perm = np.empty(wt, dtype=np.int64)
                perm[np.argsort(fr, kind="stable")] = np.argsort(ft, kind="stable")
                prel = _rel(t[:, perm], r)
                if prel < rel:
                    runs = _runs(perm)
                    add("permutation", prel, _cos(t[:, perm], r), relation="1:1", reference_modules=names,
                        runs=runs[:16], runs_total=len(runs),
                        note="target features permuted: reference[:, j0:j0+n] = target[:, t0:t0+n] for each run "
                             "[t0, j0, n]; needs an aligner")
        elif wt > widths[0]:
            for a, rel in find_slices(t, r):
                add("slice-of-target", rel, _cos(t[:, a:a + widths[0]], r), reference_modules=names,
                    target_slice=[a, a + widths[0]], target_width=wt,
                    note="the reference is target[:, a:b]; needs an aligner (or the target computes more)")
        else:
            for a, rel in find_slices(r, t):
                add("slice-of-reference", rel, _cos(t, r[:, a:a + wt]), reference_modules=names,
                    reference_slice=[a, a + wt], reference_width=widths[0],
                    note="the target is reference[:, a:b]; needs an aligner")
        return out

    if sum(widths) == wt:
        orders = itertools.permutations(range(len(refs))) if len(refs) <= MAX_PERMUTE else [tuple(range(len(refs)))]
        for order in orders:
            cat = np.concatenate([refs[i] for i in order], axis=1)
            add("concat", _rel(t, cat), _cos(t, cat), relation="1:N", reference_modules=[names[i] for i in order],
                split_sizes=[widths[i] for i in order])
    parts = []
    for name, r in zip(names, refs):
        if r.shape[1] <= wt:
            a, rel = find_slices(t, r, top=1)[0]
            parts.append({"module": name, "target_slice": [a, a + r.shape[1]], "rel_err": _num(rel)})
    if parts and len(parts) == len(refs):
        add("slices", max(p["rel_err"] for p in parts), float("nan"), parts=parts,
            note="each reference module matched by a slice of the target; needs an aligner if not a plain concat")
    return out


def infer_match(target: Trace, reference: Trace, target_module: str, reference_modules: list[str], *,
                target_port: str | None = None, reference_port: str | None = None,
                tol: float = 0.05, max_rows: int = MAX_ROWS, top: int = 6) -> dict[str, Any]:
    module_calls(target, target_module, "target")
    for m in reference_modules:
        module_calls(reference, m, "reference")
    t_ports = [target_port] if target_port else ["output"]
    r_ports = [reference_port] if reference_port else ["output", "input"]
    found: list[dict[str, Any]] = []
    tried: list[str] = []
    for tp in t_ports:
        for ts in selects_for(target, target_module, tp):
            got = endpoint_rows(target, target_module, tp, ts)
            if got is None:
                continue
            t_keys, t_rows = got
            for rp in r_ports:
                r_sides = []
                for m in reference_modules:
                    rg = endpoint_rows(reference, m, rp, "first")
                    if rg is None:
                        break
                    r_sides.append(rg)
                if len(r_sides) != len(reference_modules):
                    tried.append(f"reference {rp}: no float tensor")
                    continue
                common = set(t_keys).intersection(*[set(k) for k, _ in r_sides])
                if not common:
                    tried.append(f"target {tp}[{ts}] / reference {rp}: no (sequence, position) in common")
                    continue
                keys = sorted(common)
                if len(keys) > max_rows:
                    keys = [keys[i] for i in np.linspace(0, len(keys) - 1, max_rows).round().astype(int)]
                t_idx = {k: i for i, k in enumerate(t_keys)}
                t = t_rows[[t_idx[k] for k in keys]]
                refs = []
                for rk, ra in r_sides:
                    idx = {k: i for i, k in enumerate(rk)}
                    refs.append(ra[[idx[k] for k in keys]])
                tried.append(f"target {tp}[{ts}] width {t.shape[1]} vs reference {rp} widths "
                             f"{[r.shape[1] for r in refs]} on {len(keys)} rows")
                for cand in _candidates(t, refs, list(reference_modules), tol):
                    cand.update(target_port=tp, target_select=ts, reference_port=rp, rows_compared=len(keys))
                    if cand.get("relation") and cand["kind"] in ("identity", "scaled", "concat"):
                        cand["propose"] = {k: v for k, v in {
                            "target_module": target_module, "reference_modules": cand["reference_modules"],
                            "relation": cand["relation"], "port": rp, "select": "first",
                            "target_select": ts, "split_sizes": cand.get("split_sizes"),
                            "scale": cand.get("scale")}.items() if v is not None}
                    found.append(cand)
    found.sort(key=lambda c: (c["rel_err"] if math.isfinite(c["rel_err"]) else 1e30))
    best = found[0] if found else None
    if best is None:
        verdict = "nothing comparable: " + "; ".join(tried or ["no float tensors"])
    elif best["rel_err"] <= tol:
        verdict = f"match: {best['kind']} (relative error {best['rel_err']:.3g} ≤ {tol:g})"
    elif best["rel_err"] <= 4 * tol or best.get("cosine", 0) >= 0.99:
        verdict = (f"close: {best['kind']} (relative error {best['rel_err']:.3g}, cosine {best['cosine']:.4f}) — "
                   "plausible within low-precision noise, or a real numerical difference")
    else:
        verdict = (f"no match (best {best['kind']}: relative error {best['rel_err']:.3g}); if the mapping is right "
                   "the component itself may be the bug")
    return {"target_module": target_module, "reference_modules": reference_modules, "verdict": verdict,
            "tolerance": tol, "candidates": found[:top], "tried": tried,
            "dtypes": {"target": target.run.dtype, "reference": reference.run.dtype}}


def order_problem(target: Trace, reference: Trace, pair: Any, tol: float) -> str | None:
    """For a 1:N pair: a problem when another order of the reference modules matches the target clearly better
    than the proposed one (the validator's shape checks cannot see a swapped concatenation): it matches within
    ``tol`` where the proposed order does not, or — on traces where an upstream bug leaves nothing within ``tol`` —
    its error is below :data:`CLEARLY_BETTER` times the proposed order's."""
    refs_ep = pair.reference
    if len(refs_ep.modules) < 2 or len(refs_ep.modules) > MAX_PERMUTE or len(pair.target.modules) != 1:
        return None
    if pair.target.select not in ("first", "stream", "all") or refs_ep.select not in ("first", "stream", "all"):
        return None
    got = endpoint_rows(target, pair.component, "output", pair.target.select)
    sides = [endpoint_rows(reference, m, refs_ep.port, refs_ep.select) for m in refs_ep.modules]
    if got is None or any(s is None for s in sides):
        return None
    common = set(got[0]).intersection(*[set(s[0]) for s in sides if s is not None])
    if not common:
        return None
    keys = sorted(common)
    if len(keys) > MAX_ROWS:
        keys = [keys[i] for i in np.linspace(0, len(keys) - 1, MAX_ROWS).round().astype(int)]
    t_idx = {k: i for i, k in enumerate(got[0])}
    t = got[1][[t_idx[k] for k in keys]] * (pair.target.scale or 1.0)
    refs = []
    for s in sides:
        idx = {k: i for i, k in enumerate(s[0])}  # type: ignore[index]
        refs.append(s[1][[idx[k] for k in keys]])  # type: ignore[index]
    if sum(r.shape[1] for r in refs) != t.shape[1]:
        return None
    proposed = _rel(t, np.concatenate(refs, axis=1))
    best, best_order = proposed, None
    for order in itertools.permutations(range(len(refs))):
        rel = _rel(t, np.concatenate([refs[i] for i in order], axis=1))
        if rel < best:
            best, best_order = rel, order
    if best_order is not None and ((best <= tol and proposed > 4 * tol) or best < CLEARLY_BETTER * proposed):
        names = [refs_ep.modules[i] for i in best_order]
        sizes = [refs[i].shape[1] for i in best_order]
        return (f"the reference modules in the order {names} (split_sizes {sizes}) match the target far better "
                f"(relative error {best:.3g}) than the proposed order ({proposed:.3g})")
    return None
