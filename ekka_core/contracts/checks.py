"""What a check hands to the verdict composer: its status, its findings, what it compared and what it could not.

A *check* (``ekka_core/checks/``) is one question the diagnosis asks of the evidence — does the served output agree
with the reference, did the engine feed the same ids, which module departs first, does any module produce NaN — and
answers with a :class:`CheckOutcome`. The composer (``ekka_core/checks/verdict.py``) alone turns the outcomes into
the verdict; ``report.json`` keeps each outcome's :class:`CheckRecord` (``checks[]``) so every surface can say what
was looked at and what was not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ekka_core.contracts.ranking import Suspect
from ekka_core.contracts.report import CheckRecord, CheckStatus

@dataclass
class CheckOutcome:
    record: CheckRecord
    # Ranked findings (suspects of the check's kinds), most suspicious first; ranks are the composer's to set.
    findings: list[Suspect] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)        # said in the report's notes, in order
    # Said first in the report's notes when this check is the one that decides the verdict (why it does).
    deciding_note: str = ""
    # Where the findings rank among other checks' ratio-level findings: lower first (a NaN output outranks a ratio:
    # it is where the computation stops meaning anything).
    precedence: int = 1

    @property
    def status(self) -> CheckStatus:
        return self.record.status
