"""What analysis hands to the report: one result per compared pair, the ranked suspects, the verdict.

Torch-free, so that shells and light processes read a ranking without the analysis stage's dependencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ekka_core.contracts.graph import NodeSource, PassFinding
from ekka_core.contracts.jsonable import NON_FINITE_JSON, to_json
from ekka_core.contracts.report import InputsDiffer, RowFinding, SuspectKind, Unchecked, Verdict

# A non-finite output (NaN/inf, e.g. fp16 overflow) is the strongest divergence there is; it is reported as this
# ratio so that it ranks above everything and stays valid JSON (the number the JSON codec writes for it).
NON_FINITE_RATIO = NON_FINITE_JSON


def finite_ratio(r: float) -> float:
    """A ratio as a number every comparison and JSON can take: NaN/inf become :data:`NON_FINITE_RATIO`."""
    return r if math.isfinite(r) else NON_FINITE_RATIO

# The error ratio's denominator floor, shared by every ratio Ekka computes (per module, per token, at the logits):
# a fraction of the dtype's unit roundoff relative to ‖Y_R‖, and never below what two correct fp32 kernels differ by.
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}
KERNEL_NOISE_FLOOR = 1e-5


def noise_floor(dtype: str) -> float:
    """Relative floor of ‖X_R − Y_R‖ (where the low-precision reference happens to equal fp32)."""
    return max(0.25 * UNIT_ROUNDOFF.get(dtype.removeprefix("torch."), 2.0 ** -8), KERNEL_NOISE_FLOOR)


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
    # Distance from the low-precision reference in units of that reference's own rounding error:
    # ‖X_T − X_R‖ / ‖X_R − Y_R‖ — of the output and of the input (None: inputs not compared). An input at ≈ 0 means
    # target and reference were fed the same tensor; a correct engine then stays within a few ulps of X_R.
    same_dtype: float | None = None
    input_same_dtype: float | None = None
    entered_after: int | None = None          # when the module started, on the completion clock (see ModuleCall)


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
    # "module": the module's own computation introduces the error; "glue": the code of `module`'s forward that runs
    # between two of its children (`between`, at `lines` of forward_file) does; "convention": the module departs
    # from the reference's own low-precision rounding (closer to fp32 than the reference).
    # "non-finite": the first module whose output holds NaN/Inf where the reference's is finite; "rows": a module
    # wrong on a few rows its pooled ratio averages away (see contracts.report.SuspectKind).
    kind: SuspectKind = "module"
    between: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)      # [first, last] line of forward_file
    same_dtype: float | None = None
    noise: float | None = None      # convention: the largest distance correct engines show there (noise model)
    rows: list[RowFinding] = field(default_factory=list)     # rows / non-finite: the rows named
    non_finite: int = 0             # non-finite: how many output values are NaN/Inf
    graph_nodes: list[NodeSource] = field(default_factory=list)        # compiled: the departing graph nodes
    compiler_stages: list[PassFinding] = field(default_factory=list)   # compiled: stages whose removal fixes it


@dataclass
class Ranking:
    verdict: Verdict
    threshold: float
    dtype: str
    pairs: list[PairResult] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    change_point: int | None = None            # index into pairs
    # Departures from the reference's low-precision convention (suspects of kind "convention"), ranked after the
    # ratio-level suspects; they decide the verdict only where nothing else explains an output-level difference.
    conventions: list[Suspect] = field(default_factory=list)
    unchecked: list[Unchecked] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inputs_differ: list[InputsDiffer] = field(default_factory=list)
    prompt_lens: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return to_json(self)
