"""The verdict composer: the one place that turns the checks' outcomes into the verdict and the ranked suspects.

Precedence, first row that holds wins (check names are the modules of ``ekka_core/checks/``):

=====  ====================================================  =============  ==========================================
row    when                                                  verdict        suspects
=====  ====================================================  =============  ==========================================
1      ``inputs`` diverges                                   inputs-differ  none: no tensor was compared
2      a ratio-level finding: ``modules`` (module, glue),    divergent      by the outcome's ``precedence`` (a
       ``non-finite``, ``rows`` or any other ranked check                   NaN/Inf output first), then in the order
       diverges                                                             the checks ran; departures from the
                                                                            reference's rounding ranked after them
3      ``conventions`` diverges                              divergent      the departures from the rounding
4      ``served-output`` diverges                            divergent      none: the served output departs and no
                                                                            traced module explains it (said first in
                                                                            the notes, with triage's words)
5      any check is inconclusive                             inconclusive   none; ``missing`` lists what could not be
                                                                            observed, each with its fix
6      otherwise                                             consistent     none (rounding departures within noise
                                                                            are listed, ranked)
=====  ====================================================  =============  ==========================================

``traced-output`` diverging alone does not decide (row 4 is the served run's): the traced baseline's own module
comparison (row 2) is the finer instrument on the same run, and triage reports the direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ekka_core.checks.base import Evidence
from ekka_core.checks.output import SERVED_OUTPUT, TRACED_OUTPUT
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.ranking import Ranking, Suspect
from ekka_core.contracts.report import Verdict

NOT_RATIO_LEVEL = ("inputs", "conventions", "served-output", "traced-output", "triage")


@dataclass
class Composed:
    verdict: Verdict
    suspects: list[Suspect] = field(default_factory=list)
    conventions: list[Suspect] = field(default_factory=list)
    lead_notes: list[str] = field(default_factory=list)     # said before every other note
    notes: list[str] = field(default_factory=list)          # said after the comparison's own notes
    missing: list[str] = field(default_factory=list)


def conclude(evidence: Evidence, ranking: Ranking) -> Composed:
    """The output checks of the runs the diagnosis made, then the verdict, applied to ``ranking`` (verdict,
    suspects, conventions, notes) — the last step before the report is built."""
    for check in (SERVED_OUTPUT, TRACED_OUTPUT):
        if getattr(evidence, check.field) is not None:
            evidence.outcomes.append(check.run(evidence))
    composed = compose(evidence)
    ranking.verdict, ranking.suspects, ranking.conventions = composed.verdict, composed.suspects, composed.conventions
    ranking.notes = composed.lead_notes + ranking.notes + composed.notes
    return composed


def compose(evidence: Evidence) -> Composed:
    outcomes = evidence.outcomes
    notes = [n for o in outcomes for n in o.notes if o.record.check != "conventions"]

    def named(name: str) -> list[CheckOutcome]:
        return [o for o in outcomes if o.record.check == name]

    if any(o.status == "diverges" for o in named("inputs")):                                   # row 1
        return Composed("inputs-differ", notes=notes)
    conv = next(iter(named("conventions")), None)
    conventions = list(conv.findings) if conv else []
    ratio_level = [o for o in outcomes
                   if o.record.check not in NOT_RATIO_LEVEL and o.status == "diverges" and o.findings]
    ratio_level.sort(key=lambda o: o.precedence)          # stable: checks of equal precedence in the order run
    if ratio_level:                                                                              # row 2
        suspects = _unique([s for o in ratio_level for s in o.findings])
        _rank(suspects)
        _rank(conventions, start=len(suspects) + 1)
        return Composed("divergent", suspects, conventions, notes=notes)
    _rank(conventions)
    if conv is not None and conv.status == "diverges":                                           # row 3
        return Composed("divergent", list(conventions), conventions, lead_notes=[conv.deciding_note], notes=notes)
    notes += conv.notes if conv else []
    served = evidence.served_check
    if served is not None and any(o.status == "diverges" for o in named("served-output")):      # row 4
        t = evidence.triage
        why = t.words if t and t.words else "no traced module departs from the reference"
        lead = f"the served configuration diverges at the output level (ratio {served.ratio:.2f}) but {why}"
        # What the in-graph localisation could not observe is said with it: the verdict rests on triage alone.
        lead += "".join(f"; {m}" for o in named("graph") if o.status == "inconclusive" for m in o.record.missing)
        return Composed("divergent", [], conventions, lead_notes=[lead], notes=notes)
    missing = [m for o in outcomes if o.status == "inconclusive" for m in o.record.missing]
    if missing:                                                                                  # row 5
        return Composed("inconclusive", [], conventions, notes=notes, missing=missing)
    return Composed("consistent", [], conventions, notes=notes)                                  # row 6


def _rank(suspects: list[Suspect], start: int = 1) -> None:
    for i, s in enumerate(suspects, start):
        s.rank = i


def _unique(suspects: list[Suspect]) -> list[Suspect]:
    """One entry per module: a module two checks blame is ranked where it is first blamed (a non-finite output
    before the same module's ratio)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for s in suspects:
        key = (s.module, "glue" if s.kind == "glue" else "")
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out
