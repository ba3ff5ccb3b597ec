"""Stage 5 — analysis: error ratios, the first sustained divergence, local blame, ranked suspects.

Entry point: :func:`analyse`.

Error ratio (Ekka paper): ``r = ‖X_T − Y_R‖ / max(‖X_R − Y_R‖, floor)``. X_T is the target in the low precision
under test, X_R the reference in that precision, Y_R the reference in fp32. r ≈ 1 when the target is as close to
fp32 as the reference's own low-precision run; a bug lifts it far above (paper: correct ≤ 1.5, buggy 3.1–1093).
The floor (a fraction of the dtype's unit roundoff, relative to ‖Y_R‖) keeps r finite where the low-precision
reference happens to equal fp32.

First divergence: errors propagate and grow, so the *maximum* ratio is usually far downstream of the cause.
We walk the pairs in the target's execution order and run change-point detection on log10(r) with ruptures'
PELT (exact segmentation, linear time; ``l2`` cost = shifts in mean, which is what a bug does to log r) with a
BIC-style penalty ``pen = 2·σ²·ln n`` (σ² the noise variance of log r estimated robustly from successive
differences, floored so that flat clean series give no breakpoints) and ``min_size=1`` (a bug in the very last
module, the logits, must still be a segment of its own). The first segment whose median ratio exceeds the
threshold starts the divergence; it must be *sustained*: the median ratio from there to the end stays above the
threshold (a one-off spike from alignment noise does not).

Local blame: a pair whose input agrees (input ratio, or the preceding pair's ratio, ≤ threshold) while its output
does not is where the error was introduced. Ranking (documented in :func:`_rank`): the change point's locally
blamed pair first, then other locally blamed pairs in execution order, then the enclosing modules of the top
suspect (the bug may be in the parent's own forward code between modules).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import torch

from ekka_core.align import AlignedPair, AlignedPairs
from ekka_core.contracts.ranking import NON_FINITE_RATIO, PairResult, Ranking, Suspect

__all__ = ["NON_FINITE_RATIO", "PairResult", "Ranking", "Suspect", "analyse", "error_ratio"]

UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}
KERNEL_NOISE_FLOOR = 1e-5   # relative error two correct fp32 kernels can differ by (different summation order)


def error_ratio(x_t: torch.Tensor, x_r: torch.Tensor, y_r: torch.Tensor, dtype: str, dim: int | None = None):
    floor_rel = max(0.25 * UNIT_ROUNDOFF.get(dtype, 2.0 ** -8), KERNEL_NOISE_FLOOR)
    if dim is None:
        num, den, ref = (x_t - y_r).norm(), (x_r - y_r).norm(), y_r.norm()
    else:
        num, den, ref = (x_t - y_r).norm(dim=dim), (x_r - y_r).norm(dim=dim), y_r.norm(dim=dim)
    floor = (floor_rel * ref).clamp_min(1e-30)
    return num / torch.maximum(den, floor)


def analyse(aligned: AlignedPairs, *, threshold: float, dtype: str, target_classes: dict[str, dict[str, Any]],
            prompt_lens: list[int], unchecked: list[dict[str, str]] | None = None) -> Ranking:
    """``target_classes``: module path → {cls, file, line, forward_file, forward_line} from the Model Tree."""
    results: list[PairResult] = []
    for ap in aligned:
        results.append(_pair_result(ap, dtype, target_classes))
    ranking = Ranking(verdict="consistent", threshold=threshold, dtype=dtype, pairs=results,
                      unchecked=list(unchecked or []), prompt_lens=prompt_lens)
    ranking.unchecked += [{"module": f, "reason": "alignment failed"} for f in aligned.failures]
    ranking.notes.append("post-logits sampling (temperature, top-p, penalties) is outside per-module comparison")
    if not results:
        ranking.notes.append("no mapped pair could be compared")
        return ranking

    ratios = np.array([max(_finite(p.error_ratio), 1e-6) for p in results])
    start = _first_sustained_shift(np.log10(ratios), math.log10(threshold))
    if start is None:
        above = [p.component for p in results if p.error_ratio > threshold]
        if above:
            ranking.notes.append(f"isolated ratios above {threshold} that do not persist downstream "
                                 f"(treated as noise): {', '.join(above[:5])}")
        return ranking
    ranking.verdict = "divergent"
    ranking.change_point = start
    ranking.suspects = _rank(results, start, threshold, target_classes, prompt_lens)
    return ranking


def _finite(r: float) -> float:
    return r if math.isfinite(r) else NON_FINITE_RATIO


def _ratios(x_t: torch.Tensor, x_r: torch.Tensor, y_r: torch.Tensor, dtype: str
            ) -> tuple[float, list[float], float]:
    """Overall ratio, per-row ratios and ‖X_T − Y_R‖/‖Y_R‖ from one pass over the differences (a Frobenius norm is
    the 2-norm of the row norms); the same floor as :func:`error_ratio`."""
    floor_rel = max(0.25 * UNIT_ROUNDOFF.get(dtype, 2.0 ** -8), KERNEL_NOISE_FLOOR)
    num, den, ref = (x_t - y_r).norm(dim=1), (x_r - y_r).norm(dim=1), y_r.norm(dim=1)
    rows = num / torch.maximum(den, (floor_rel * ref).clamp_min(1e-30))
    n, d, f = num.norm(), den.norm(), ref.norm()
    overall = float(n / torch.maximum(d, (floor_rel * f).clamp_min(1e-30)))
    return overall, rows.tolist(), float(n / f.clamp_min(1e-30))


def _pair_result(ap: AlignedPair, dtype: str, classes: dict[str, dict[str, Any]]) -> PairResult:
    overall, rows, rel = _ratios(ap.target, ap.reference, ap.reference_fp32, dtype)
    r = _finite(overall)
    rin = None
    if ap.inputs is not None:
        rin = _finite(_ratios(*ap.inputs, dtype)[0])
    per_tok = [_finite(v) for v in rows]
    return PairResult(component=ap.pair.component, cls=classes.get(ap.pair.component, {}).get("cls", "?"),
                      order=ap.order, reference_modules=list(ap.pair.reference.modules), rule=ap.pair.rule,
                      error_ratio=r, input_ratio=rin, rel_error=rel,
                      token_ratios=[(s, p, float(v)) for (s, p), v in zip(ap.keys, per_tok)])


def _first_sustained_shift(log_r: np.ndarray, log_thr: float) -> int | None:
    log_r = np.nan_to_num(np.asarray(log_r, dtype=float), nan=math.log10(NON_FINITE_RATIO),
                          posinf=math.log10(NON_FINITE_RATIO), neginf=-6.0)
    n = len(log_r)
    if n == 0 or not (log_r > log_thr).any():
        return None
    import ruptures as rpt   # only when something exceeds the threshold: a clean run never pays for it

    diffs = np.diff(log_r)
    sigma = 1.4826 * np.median(np.abs(diffs - np.median(diffs))) / math.sqrt(2) if n > 2 else 0.0
    sigma = max(sigma, 0.1)     # 0.1 in log10 ≈ 25 % ratio jitter: what bf16 noise does to r
    pen = 2 * sigma ** 2 * math.log(max(n, 2))
    bkps = [0] + rpt.Pelt(model="l2", min_size=1, jump=1).fit(log_r.reshape(-1, 1)).predict(pen=pen)
    for a, b in zip(bkps, bkps[1:]):
        if np.median(log_r[a:b]) > log_thr:
            first = a + int(np.argmax(log_r[a:b] > log_thr))
            if np.median(log_r[first:]) > log_thr:
                return first
    # No segment stands out on its own, but a single sustained tail may still exist (short series).
    for i in range(n):
        if log_r[i] > log_thr and np.median(log_r[i:]) > log_thr:
            return i
    return None


def _blamed(results: list[PairResult], i: int, threshold: float) -> bool:
    p = results[i]
    if p.error_ratio <= threshold:
        return False
    if p.input_ratio is not None:
        return p.input_ratio <= threshold
    # No comparable input: the preceding pair in execution order stands in for it. Parents complete after
    # their children, so a parent never looks locally to blame for its children's error.
    prev = next((q for q in reversed(results[:i]) if not q.component.startswith(p.component + ".")), None)
    return prev is None or prev.error_ratio <= threshold


def _onset(p: PairResult, threshold: float, prompt_lens: list[int]) -> tuple[int | None, str | None]:
    """First token position where this pair's ratio rises above the threshold and stays there (per sequence)."""
    best: int | None = None
    best_seq = 0
    by_seq: dict[int, list[tuple[int, float]]] = {}
    for s, pos, r in p.token_ratios:
        by_seq.setdefault(s, []).append((pos, r))
    for s, rows in by_seq.items():
        rows.sort()
        vals = np.array([r for _, r in rows])
        for j, (pos, r) in enumerate(rows):
            if r > threshold and np.median(vals[j:]) > threshold:
                if best is None or pos < best:
                    best, best_seq = pos, s
                break
    if best is None:
        return None, None
    prompt_len = prompt_lens[best_seq] if best_seq < len(prompt_lens) else best + 1
    return best, "prefill" if best < prompt_len else f"decode:{best - prompt_len + 1}"


def _rank(results: list[PairResult], start: int, threshold: float, classes: dict[str, dict[str, Any]],
          prompt_lens: list[int]) -> list[Suspect]:
    """Rank 1: the first locally blamed pair at or after the change point (where the error is introduced).
    Then: later locally blamed pairs (independent second sources), in execution order. Then the enclosing
    modules of rank 1, nearest first (the bug may sit in the parent's forward between two modules)."""
    order: list[int] = []
    for i in range(start, len(results)):
        name = results[i].component
        # A module enclosing an already chosen suspect inherits its error; it is not a second source.
        if _blamed(results, i, threshold) and not any(results[j].component.startswith(name + ".") for j in order):
            order.append(i)
    if not order:
        order = [start]
    suspects: list[Suspect] = []
    for i in order[:3]:
        suspects.append(_suspect(results[i], len(suspects) + 1, threshold, classes, prompt_lens,
                                 "change point" if i == order[0] else "locally blamed"))
    top = results[order[0]].component
    by_name = {p.component: p for p in results}
    parts = top.split(".")
    named = {s.module for s in suspects}
    for k in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:k])
        if parent in named:
            break
        if re.fullmatch(r".*\.\d+", parent) is None and parent in classes and len(suspects) < 5:
            pr = by_name.get(parent)
            s = _suspect(pr, len(suspects) + 1, threshold, classes, prompt_lens, "encloses the top suspect") if pr \
                else None
            if s is None:
                c = classes[parent]
                s = Suspect(len(suspects) + 1, parent, c["cls"], c["file"], c["line"], c["forward_file"],
                            c["forward_line"], [], float("nan"), None, None, None,
                            f"encloses {top}; its own forward code runs around it")
            suspects.append(s)
            break
    return suspects


def _suspect(p: PairResult, rank: int, threshold: float, classes: dict[str, dict[str, Any]],
             prompt_lens: list[int], why: str) -> Suspect:
    c = classes.get(p.component, {})
    onset, phase = _onset(p, threshold, prompt_lens)
    if p.input_ratio is not None:
        inp = f"its input agrees with the reference (ratio {p.input_ratio:.2f})"
    else:
        inp = "the module before it agrees with the reference"
    where = f" from token {onset} ({phase})" if onset is not None else ""
    evidence = (f"{why}: output error ratio {p.error_ratio:.1f} (threshold {threshold}) while {inp}; "
                f"diverges{where}; compared with {', '.join(p.reference_modules) or '—'} via rule '{p.rule}'")
    return Suspect(rank, p.component, p.cls, c.get("file"), c.get("line"), c.get("forward_file"),
                   c.get("forward_line"), p.reference_modules, p.error_ratio, p.input_ratio, onset, phase, evidence)
