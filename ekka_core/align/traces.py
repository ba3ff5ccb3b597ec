"""What the align stage reads and how it fails: the three traces, the (sequence, position) key of a row, and the
error of a pair that cannot be aligned."""

from __future__ import annotations

from dataclasses import dataclass

from ekka_core.capture.trace import Trace
from ekka_core.contracts.errors import InternalFailure

Key = tuple[int, int]   # (sequence, position)


class AlignmentError(InternalFailure):
    """An aligner's self-check failed: the pair cannot be compared as declared."""


@dataclass
class Traces:
    target: Trace          # X_T: target engine, low precision
    reference: Trace       # X_R: reference, same low precision
    reference_fp32: Trace  # Y_R: reference, fp32


def positions_restricted(traces: Traces) -> bool:
    """Traces restricted to some token positions keep the rows in the set on both sides, plus the rows where each
    side sampled — those differ, so only the rows both kept are compared."""
    return any(tr.run.trace_options.get("positions") for tr in (traces.target, traces.reference))
