"""The observations of a diagnosis on one clock, the first sustained shift among them, and where an error is
introduced.

**Observations in time order.** Every compared pair gives an observation when its module completes (its output)
and, where its inputs are comparable, one when it starts (its input) — on one clock, the completion order of the
target's calls (a module's input is observed after the last call that completed before it started). Errors
propagate and grow, so the *maximum* is usually far downstream of the cause: change-point detection with ruptures'
PELT on log10(r) along that clock finds the first *sustained* shift (``l2`` cost = shifts in mean; penalty
``2·σ²·ln n`` with σ² the noise variance of log r from successive differences, floored so that a flat clean series
gives no breakpoint; ``min_size=1`` so the very last module, the logits, can be a segment of its own). The shift
must be sustained: the median ratio from there to the end stays above the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ekka_core.contracts.ranking import NON_FINITE_RATIO, PairResult


@dataclass
class _Obs:
    """One observation on the completion clock: a pair's output (at its completion) or input (at its start)."""

    pair: int
    port: str            # "output" | "input"
    time: float
    ratio: float
    same: float | None = None    # distance from the low-precision reference, in units of its own rounding error


def _observations(results: list[PairResult]) -> list[_Obs]:
    """Outputs at their completion, inputs when their module started (just after the call completed before it;
    an outer module's input before an inner one's at the same moment), sorted on that one clock."""
    obs = []
    for i, p in enumerate(results):
        obs.append(_Obs(i, "output", float(p.order), p.error_ratio, p.same_dtype))
        if p.input_ratio is not None and p.entered_after is not None:
            obs.append(_Obs(i, "input", p.entered_after + 0.5 + 1e-3 * p.component.count("."), p.input_ratio,
                            p.input_same_dtype))
    obs.sort(key=lambda o: (o.time, o.port != "input"))
    return obs


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


def _introduced_here(results: list[PairResult], obs: list[_Obs], k: int, threshold: float) -> str | None:
    """Why observation ``k`` (red) is where the error was introduced, or None when something before it was red
    already: "module" (its module's input agrees), "glue" (a module's input departs while the output observed just
    before agrees)."""
    o = obs[k]
    if o.ratio <= threshold:
        return None
    p = results[o.pair]
    prev = _previous(results, obs, k)
    if o.port == "input":
        return "glue" if prev is None or prev.ratio <= threshold else None
    if p.input_ratio is not None:
        return "module" if p.input_ratio <= threshold else None
    return "module" if prev is None or prev.ratio <= threshold else None


def _previous(results: list[PairResult], obs: list[_Obs], k: int) -> _Obs | None:
    """The observation just before ``k`` that is not part of ``k``'s own module (a parent completes after its
    children, so a parent's output never stands in for its own input)."""
    name = results[obs[k].pair].component
    for j in range(k - 1, -1, -1):
        q = obs[j]
        other = results[q.pair].component
        if q.pair == obs[k].pair:
            continue
        if obs[k].port == "output" and other.startswith(name + "."):
            continue
        return q
    return None
