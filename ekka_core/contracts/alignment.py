"""What the align stage hands on about pairs it could not align: the component and why, never a bare message.

Analysis lists each such failure as *not checked* (``report.json`` ``unchecked[]``: ``{module, reason}``), so the
record names the component the report is about and keeps the aligner's explanation as the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ekka_core.contracts.report import Unchecked

ALIGNMENT_FAILED = "alignment failed"     # how an unchecked entry's reason starts when alignment failed
TIED_OUT = ("not compared: every row follows an MoE routing tie of its sequence within the reference's rounding "
            "(a correct engine may route it either way, and attention carries it to every later position)")


@dataclass(frozen=True)
class AlignmentFailure:
    component: str          # the target module path of the pair (ComponentPair.component)
    reason: str             # why it could not be aligned (the AlignmentError's message)

    def unchecked(self) -> Unchecked:
        """The pair as a ``report.json`` ``unchecked[]`` entry."""
        return Unchecked(self.component, f"{ALIGNMENT_FAILED}: {self.reason}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "AlignmentFailure":
        return AlignmentFailure(str(d["component"]), str(d["reason"]))
