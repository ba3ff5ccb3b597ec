"""The output-level check: an engine run's sampled logprobs against the reference teacher-forced on the same ids
(:func:`ekka_core.symptom.check_symptom` computed the ratio; this check says what it means for the verdict).

A run that compared no position (no logprobs returned, every position left out) has not been observed: that is
``inconclusive``, never ``agrees``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ekka_core.checks.base import Evidence
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.report import CheckRecord
from ekka_core.contracts.serving import SymptomCheck


@dataclass(frozen=True)
class OutputCheck:
    name: str                 # "served-output" | "traced-output"
    field: str                # the Evidence field holding the SymptomCheck

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.field,)

    def run(self, evidence: Evidence) -> CheckOutcome:
        check: SymptomCheck = getattr(evidence, self.field)
        compared = len(check.positions)
        if not compared:
            return CheckOutcome(CheckRecord(self.name, "inconclusive", f"{check.label}: no sampled position compared",
                                            compared=0, missing=[
                f"{check.label}: the engine returned no logprobs to compare (ask for logprobs, and at least one "
                f"new token: --max-new-tokens 1 or more)"]))
        return CheckOutcome(CheckRecord(self.name, "diverges" if check.diverges else "agrees", check.words(),
                                        compared=compared))


SERVED_OUTPUT = OutputCheck("served-output", "served_check")
TRACED_OUTPUT = OutputCheck("traced-output", "traced_check")
