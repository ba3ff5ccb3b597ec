"""What every check reads and the shape of a check.

The pipeline fills one :class:`Evidence` as its stages run (the served run and its symptom check, the traced
comparison, triage); a check reads the fields it names in ``needs`` and answers with a
:class:`~ekka_core.contracts.checks.CheckOutcome`. A check whose evidence is absent is ``skipped``, never silently
``agrees``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.graph import GraphLocalisation
from ekka_core.contracts.ranking import Ranking
from ekka_core.contracts.report import CheckRecord
from ekka_core.contracts.serving import SymptomCheck, Triage
from ekka_core.contracts.spec import DiagnosisSpec


@dataclass
class Evidence:
    spec: DiagnosisSpec
    served_check: SymptomCheck | None = None      # the served configuration, untraced (None: not run)
    traced_check: SymptomCheck | None = None      # the traced baseline's output, scored the same way
    ranking: Ranking | None = None                # the traced module comparison (the culprit trace's, after triage)
    aligned: Any = None                           # its aligned pairs (ekka_core.align.AlignedPairs)
    triage: Triage | None = None
    graph: GraphLocalisation | None = None        # in-graph localisation, when triage found compilation decides
    outcomes: list[CheckOutcome] = field(default_factory=list)   # what earlier checks found, in order

    @property
    def compared(self) -> Ranking:
        """The traced comparison, for a check that ``needs`` it (run_check has made sure it is there)."""
        assert self.ranking is not None, "a check that reads the comparison must declare needs=('ranking',)"
        return self.ranking


# What each Evidence field is, in words (a skipped check says what it lacked).
EVIDENCE_WORDS = {"served_check": "served run", "traced_check": "traced run", "ranking": "traced module comparison",
                  "aligned": "aligned tensors", "triage": "configuration triage",
                  "graph": "in-graph localisation (triage did not find that compilation makes the difference)"}


class Check(Protocol):
    """One question asked of the evidence. ``needs``: the :class:`Evidence` fields it reads."""

    name: str
    needs: tuple[str, ...]

    def run(self, evidence: Evidence) -> CheckOutcome: ...


class ComparisonCheck:
    """A check of the traced comparison: :meth:`judge` reads its ranking (and, where needed, the rest of the
    evidence)."""

    name: str
    needs: tuple[str, ...] = ("ranking",)
    judges_an_empty_comparison = False      # the modules check says what an empty one means; the others skip it

    def run(self, evidence: Evidence) -> CheckOutcome:
        ranking = evidence.compared
        if not ranking.pairs and not self.judges_an_empty_comparison:
            return skipped(self.name, "not run: no component pair was compared")
        return self.judge(ranking, evidence)

    def judge(self, ranking: Ranking, evidence: Evidence) -> CheckOutcome:
        raise NotImplementedError


def source_location(evidence: Evidence, module: str) -> tuple[str | None, int | None, str | None, int | None]:
    """(class file, class line, forward file, forward line) of a target module, from the trace the comparison read —
    for a check that makes a finding of its own (the modules check has them from analysis)."""
    aligned = evidence.aligned
    c = aligned.traces.target.run.module_classes.get(module) if aligned is not None else None
    return (c[2], c[3], c[4], c[5]) if c else (None, None, None, None)


def skipped(name: str, why: str) -> CheckOutcome:
    return CheckOutcome(CheckRecord(name, "skipped", why))


def run_check(check: Check, evidence: Evidence) -> CheckOutcome:
    """``check`` on ``evidence``, or ``skipped`` naming what it needs and does not have."""
    absent = [n for n in check.needs if getattr(evidence, n) is None]
    if absent:
        return skipped(check.name, f"not run: this diagnosis has no {' and no '.join(EVIDENCE_WORDS[n] for n in absent)}")
    return check.run(evidence)
