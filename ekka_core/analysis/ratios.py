"""Error ratios of one aligned pair.

**Error ratio** (Ekka paper): ``r = ‖X_T − Y_R‖ / max(‖X_R − Y_R‖, floor)``. X_T is the target in the low precision
under test, X_R the reference in that precision, Y_R the reference in fp32. r ≈ 1 when the target is as close to
fp32 as the reference's own low-precision run; a bug lifts it far above (paper: correct ≤ 1.5, buggy 3.1–1093).
The floor (:func:`~ekka_core.contracts.ranking.noise_floor`) keeps r finite where the low-precision reference
happens to equal fp32.
"""

from __future__ import annotations

from typing import Any

import torch

from ekka_core.align import AlignedPair
from ekka_core.contracts.ranking import PairResult, finite_ratio, noise_floor


def error_ratio(x_t: torch.Tensor, x_r: torch.Tensor, y_r: torch.Tensor, dtype: str, dim: int | None = None
                ) -> torch.Tensor:
    """The error ratio, overall (``dim`` None) or along ``dim``."""
    if dim is None:
        num, den, ref = (x_t - y_r).norm(), (x_r - y_r).norm(), y_r.norm()
    else:
        num, den, ref = (x_t - y_r).norm(dim=dim), (x_r - y_r).norm(dim=dim), y_r.norm(dim=dim)
    return num / torch.maximum(den, (noise_floor(dtype) * ref).clamp_min(1e-30))


def _ratios(x_t: torch.Tensor, x_r: torch.Tensor, y_r: torch.Tensor, dtype: str
            ) -> tuple[float, list[float], float, float]:
    """Overall ratio, per-row ratios, ‖X_T − Y_R‖/‖Y_R‖ and the same-dtype distance ‖X_T − X_R‖ / ‖X_R − Y_R‖, from
    one pass over each difference: the row norms, whose 2-norm (in float64) is the whole tensor's Frobenius norm. (Each
    norm taken again over the whole tensor was a second pass over it: 1.2 of 3.7 s of a 1B-shaped model's analysis.)"""
    target_fp32, reference_fp32, fp32, target_reference = (
        v.norm(dim=1) for v in (x_t - y_r, x_r - y_r, y_r, x_t - x_r))
    floor = noise_floor(dtype)
    rows = target_fp32 / torch.maximum(reference_fp32, (floor * fp32).clamp_min(1e-30))

    def whole(row_norms: torch.Tensor) -> float:
        return float(row_norms.double().square().sum().sqrt())

    num, den, ref, same = whole(target_fp32), whole(reference_fp32), whole(fp32), whole(target_reference)
    den = max(den, max(floor * ref, 1e-30))
    return num / den, rows.tolist(), num / max(ref, 1e-30), same / den


def _pair_result(ap: AlignedPair, dtype: str, classes: dict[str, dict[str, Any]]) -> PairResult:
    overall, rows, rel, same = _ratios(ap.target, ap.reference, ap.reference_fp32, dtype)
    rin = rin_same = None
    if ap.inputs is not None:
        rin_overall, _, _, rin_same = _ratios(*ap.inputs, dtype)
        rin = finite_ratio(rin_overall)
    per_tok = [finite_ratio(v) for v in rows]
    return PairResult(component=ap.pair.component, cls=classes.get(ap.pair.component, {}).get("cls", "?"),
                      order=ap.order, reference_modules=list(ap.pair.reference.modules), rule=ap.pair.rule,
                      error_ratio=finite_ratio(overall), input_ratio=rin, rel_error=rel,
                      token_ratios=[(s, p, float(v)) for (s, p), v in zip(ap.keys, per_tok)],
                      same_dtype=finite_ratio(same), input_same_dtype=None if rin_same is None else finite_ratio(rin_same))
