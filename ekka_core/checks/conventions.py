"""The reference-convention check: modules that depart from the reference's own low-precision rounding (closer to
fp32 than the reference, or rounded elsewhere) — analysis finds them (suspects of kind ``convention``); this check
says whether they explain an output-level difference.

A departure decides the verdict only when nothing ratio-level does (the composer's precedence) and it is beyond the
noise of correct engines: at a step correct engines reproduce bit for bit (clean noise 0 in the noise model: any
departure is a different computation), or with logprobs farther from the same-dtype reference than correct engines'
ever are (:data:`OUTPUT_SAME_DTYPE_NOISE`). A departure within noise is listed, and does not decide.
"""

from __future__ import annotations

from ekka_core.analysis import convention_noise
from ekka_core.checks.base import ComparisonCheck, Evidence
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.ranking import Ranking
from ekka_core.contracts.report import CheckRecord

NAME = "conventions"

# How far a correct engine's sampled logprobs are from the reference's in the same dtype, in units of that reference's
# own rounding error (SymptomCheck.same_dtype): the largest clean value over every zoo architecture, from the noise
# model (benchmarks/convention_noise.py), with a margin. Above it, an output-level difference needs an explanation.
OUTPUT_SAME_DTYPE_NOISE = 1.25 * (convention_noise().get("output_same_dtype") or 1.2)


class ConventionCheck(ComparisonCheck):
    name = NAME

    def judge(self, ranking: Ranking, evidence: Evidence) -> CheckOutcome:
        conventions = list(ranking.conventions)
        if not conventions:
            return CheckOutcome(CheckRecord(NAME, "agrees", "no module departs from the reference's rounding",
                                            compared=len(ranking.pairs)))
        checks = [c for c in (evidence.served_check, evidence.traced_check) if c is not None and c.same_dtype is not None]
        apart = max((c.same_dtype for c in checks), default=None)
        exact = [c for c in conventions if c.noise == 0.0]
        differs = apart is None or apart > 0
        if differs and (exact or (apart is not None and apart > OUTPUT_SAME_DTYPE_NOISE)):
            why = ("correct engines reproduce this step bit for bit (noise model: 0 over clean runs of every zoo "
                   "architecture), this one does not" if exact else
                   f"the engine's logprobs are {apart:.2f}× the reference's own rounding away from the reference's "
                   f"{ranking.dtype} run (correct engines: ≤ {OUTPUT_SAME_DTYPE_NOISE:.2f})")
            out = f" (its logprobs are {apart:.2f}× the reference's rounding from the {ranking.dtype} reference)" \
                if apart is not None else ""
            return CheckOutcome(
                CheckRecord(NAME, "diverges", f"{len(conventions)} module(s) depart from the reference's rounding "
                                              "beyond the noise of correct engines", compared=len(ranking.pairs)),
                findings=conventions,
                deciding_note=f"no module departs from fp32 more than the reference does, but the engine departs from "
                              f"the reference's {ranking.dtype} rounding{out}: {why}")
        return CheckOutcome(
            CheckRecord(NAME, "agrees", f"{len(conventions)} departure(s) from the reference's rounding, within the "
                                        "noise of correct engines", compared=len(ranking.pairs)),
            findings=conventions,
            notes=["departures from the reference's rounding were found (listed), within the noise of correct engines "
                   "and without an output-level effect beyond it: not a divergence"])
