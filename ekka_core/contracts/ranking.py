"""What analysis hands to the report: one result per compared pair, the ranked suspects, the verdict.

Torch-free, so that shells and light processes read a ranking without the analysis stage's dependencies.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# A non-finite output (NaN/inf, e.g. fp16 overflow) is the strongest divergence there is; it is reported as this
# ratio so that it ranks above everything and stays valid JSON.
NON_FINITE_RATIO = 1e9


@dataclass
class PairResult:
    component: str
    cls: str
    order: int
    reference_modules: list[str]
    rule: str
    error_ratio: float
    input_ratio: float | None
    rel_error: float                          # ‖X_T − Y_R‖ / ‖Y_R‖, for context
    token_ratios: list[tuple[int, int, float]] = field(default_factory=list)   # (seq, pos, r)


@dataclass
class Suspect:
    rank: int
    module: str
    cls: str
    file: str | None
    line: int | None
    forward_file: str | None
    forward_line: int | None
    reference_modules: list[str]
    error_ratio: float
    input_ratio: float | None
    onset_token: int | None
    onset_phase: str | None
    evidence: str
    call_file: str | None = None    # where the parent's forward calls this module (static source parse)
    call_line: int | None = None


@dataclass
class Ranking:
    verdict: str                               # "divergent" | "consistent" | "inputs-differ"
    threshold: float
    dtype: str
    pairs: list[PairResult] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    change_point: int | None = None            # index into pairs
    unchecked: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inputs_differ: list[dict[str, Any]] = field(default_factory=list)
    prompt_lens: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
