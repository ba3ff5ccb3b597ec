"""The symptom check, :func:`check_symptom`: an engine run's sampled logprobs against the reference's on the same
tokens, as one error ratio.

The engine ran untraced (exactly as configured) and reported, at every position it sampled, its top-k logprobs;
the reference was teacher-forced on the same ids in the same low precision (X) and in fp32 (Y)
(:func:`ekka_core.capture.run_engine`). Per sampled position, over the engine's top-k token ids, the
same error ratio as per module::

    r = ‖lp_T − lp_Y‖ / max(‖lp_X − lp_Y‖, floor)

≈ 1 when the engine's output distribution is as close to fp32 as the reference's own low-precision run, ≫ 1 when
it is not. The run diverges when the ratio over all positions exceeds the threshold. It is the fastest answer to
"is there a bug?", it sees what hooks cannot (a compiled graph), and the report leads with it.

MoE models get two more rules, both about tokens whose top-k expert choice is a tie within the reference's own
rounding (any correct engine with other rounding — a compiled graph, a fused kernel — may route them elsewhere: a
discrete jump, not a bug):

* a sampled position whose own token is tied is shown but left out of the ratio (the rule alignment applies per
  module);
* every other position attends to the tied tokens before it, so its noise floor is also the reference's distance to
  fp32 when every tied token is routed the other way (X′, ``low_rerouted``): ``max(‖X − Y‖, ‖X′ − Y‖)``. On the clean
  Qwen3-MoE zoo model served compiled this takes the ratio from 2.13 to 0.99; on its wrong-activation bug from 14.9
  to 6.3 (README.md, the benchmark section).
"""

from __future__ import annotations

import math

import numpy as np

from ekka_core.contracts.ranking import NON_FINITE_RATIO, finite_ratio, noise_floor
from ekka_core.contracts.scores import ReferenceScores
from ekka_core.contracts.serving import EngineOutputs, PositionRatio, SymptomCheck


def check_symptom(outputs: EngineOutputs, scores: ReferenceScores, *, threshold: float, label: str | None = None
                  ) -> SymptomCheck:
    floor_rel = noise_floor(outputs.dtype)
    low, high = scores.low.steps(), scores.fp32.steps()
    ties = {request: set(positions) for request, positions in scores.routing_ties.items()}
    rerouted = scores.low_rerouted.steps() if scores.low_rerouted is not None else {}
    positions: list[PositionRatio] = []
    non_finite: list[PositionRatio] = []
    norms: list[tuple[float, float, float, float]] = []   # per position: ‖T−Y‖, floor ‖X−Y‖ (or ‖X′−Y‖), ‖Y‖, ‖T−X‖
    for r in outputs.requests:
        start = len(r.prompt_token_ids) - 1
        other_way = rerouted.get(r.request, [])
        for j, (top, x, y) in enumerate(zip(r.logprobs, low.get(r.request, []), high.get(r.request, []))):
            tokens = x.tokens
            a = np.array([top[t] for t in tokens])
            xs, ys = np.array(x.logprobs), np.array(y.logprobs)
            if not np.isfinite(a).all() and np.isfinite(ys).all():
                # NaN/Inf where the reference is finite (an overflow): a divergence, never a ratio to average
                non_finite.append(PositionRatio(r.request, start + j, NON_FINITE_RATIO, False))
                positions.append(non_finite[-1])
                norms.append((math.inf, 1.0, 1.0, math.inf))
                continue
            num, den, ref, same = (float(np.linalg.norm(v)) for v in (a - ys, xs - ys, ys, a - xs))
            if j < len(other_way) and other_way[j].tokens == tokens:
                den = max(den, float(np.linalg.norm(np.array(other_way[j].logprobs) - ys)))
            norms.append((num, den, ref, same))
            ratio = num / max(den, floor_rel * ref, 1e-30)
            # A run made to sample another run's tokens (forced) picked nothing itself: its pick is its top logprob.
            own = max(top, key=top.__getitem__) if outputs.forced_tokens_from and top else \
                (r.generated[j] if j < len(r.generated) else None)
            matches = own == y.argmax
            positions.append(PositionRatio(r.request, start + j, finite_ratio(ratio), bool(matches),
                                           routing_tie=start + j in ties.get(r.request, ())))
    counted = [i for i, p in enumerate(positions) if not p.routing_tie] or list(range(len(positions)))

    def pooled(which: int) -> float:
        num2 = sum(norms[i][which] ** 2 for i in counted)
        den2, ref2 = (sum(norms[i][k] ** 2 for i in counted) for k in (1, 2))
        return math.sqrt(num2) / max(math.sqrt(den2), floor_rel * math.sqrt(ref2), 1e-30) if counted else 0.0

    overall, same = pooled(0), pooled(3)
    # NaN-safe: a ratio that is not a number is not "within the threshold"
    check = SymptomCheck(label=label or outputs.label, ratio=finite_ratio(overall),
                         diverges=bool(non_finite) or not overall <= threshold, non_finite=len(non_finite),
                         threshold=threshold, positions=positions, same_dtype=finite_ratio(same),
                         cached_tokens=sum(r.num_cached_tokens for r in outputs.requests))
    check.first = next((positions[i] for i in counted if positions[i].ratio > threshold), None) \
        if check.diverges else None
    tied = sum(p.routing_tie for p in positions)
    notes = []
    if non_finite:
        first = non_finite[0]
        notes.append(f"the engine's logprobs are NaN/Inf at {len(non_finite)} sampled position(s) where the "
                     f"reference's are finite (first: request {first.request}, token {first.position}): a "
                     f"divergence, not a ratio")
    if not positions:
        notes.append("the engine returned no logprobs to compare")
    elif tied == len(positions):
        notes.append(f"every sampled position's MoE routing is a tie within the reference's rounding: all "
                     f"{tied} are counted (none could be left out)")
    elif tied:
        notes.append(f"{tied} of {len(positions)} sampled positions left out of the ratio: their token's MoE "
                     f"expert routing is a tie within the reference's rounding (a correct engine may route it "
                     f"elsewhere)")
    if rerouted:
        check.rerouted_tokens = sum(len(v) for v in ties.values())
        notes.append(f"the noise floor includes the reference with its {check.rerouted_tokens} tied MoE tokens "
                     f"routed to their next expert, as a correct engine with other rounding may")
    check.note = "; ".join(notes)
    return check

