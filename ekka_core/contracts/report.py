"""The report contract (``ekka.report/1``, docs/DESIGN.md) as types: what ``report.json`` holds, written from
:class:`Report` and read back into it. Every consumer (CLI, Markdown, HTML, the language server, bench, bisect)
reads these fields, never string keys; the extension's ``protocol.ts`` is checked against :func:`report_schema`
(tests/contracts/test_report_schema.py), and ``ekka_core/contracts/report.schema.json`` is the generated schema.

``report.json`` holds at least ``schema``, ``verdict`` and ``suspects`` (rank, target module/class/file/line,
reference modules, error ratio, onset token, evidence); later fields are additions, never changes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ekka_core.contracts.graph import GraphLocalisation, NodeSource, PassFinding
from ekka_core.contracts.jsonable import from_json, json_schema, to_json
from ekka_core.contracts.serving import ConfigChange, SymptomCheck, Triage
from ekka_core.contracts.spec import DiagnosisSpec

SCHEMA = "ekka.report/1"
Verdict = Literal["divergent", "consistent", "inputs-differ", "inconclusive"]
VERDICTS: tuple[str, ...] = ("divergent", "consistent", "inputs-differ", "inconclusive")
# The exit code of each verdict (docs/DESIGN.md; 2 is bad input, 3 an internal failure). ``inconclusive`` has its
# own: the diagnosis could not observe what a verdict needs, which is neither "agrees" nor "found a bug".
EXIT_CODES = {"consistent": 0, "divergent": 1, "inputs-differ": 1, "inconclusive": 4}
# What a suspect is (one rendering per kind, ekka_core/report/findings.py):
#   module      the module's own computation introduces the error
#   glue        the code of the module's forward between two of its children does
#   convention  the module departs from the reference's own low-precision rounding
#   non-finite  the first module whose output holds NaN/Inf where the reference's is finite
#   rows        a module wrong on a few rows (request, token position) that its pooled ratio averages away
#   compiled    a module whose compiled code departs from the same graph run eagerly (in-graph localisation of a
#               compile-only divergence): the graph nodes, their source lines, the compiler stage that causes it
SuspectKind = Literal["module", "glue", "convention", "non-finite", "rows", "compiled"]
# The contract's minimum (docs/DESIGN.md): required in the schema although Python gives these a default.
REQUIRED = {"required": True}


# -- suspects --------------------------------------------------------------------------------------------------
@dataclass
class TargetLocation:
    """Where the suspect lives in the engine's source."""

    module: str
    cls: str = field(default="", metadata={"json": "class", "required": True})
    file: str | None = None
    line: int | None = None
    forward_file: str | None = None
    forward_line: int | None = None
    call_file: str | None = None          # where the parent's forward calls this module
    call_line: int | None = None
    lines: list[int] = field(default_factory=list)      # glue: [first, last] line of forward_file
    between: list[str] = field(default_factory=list)    # glue: the two children the code runs between


@dataclass
class ReferenceModules:
    modules: list[str] = field(default_factory=list)


@dataclass
class RowFinding:
    """One row (request, token position) of a module's output far beyond the reference's own noise there."""

    request: int
    position: int
    ratio: float


@dataclass
class Suspect:
    """One ranked finding."""

    rank: int
    target: TargetLocation
    kind: SuspectKind = "module"
    reference: ReferenceModules = field(default_factory=ReferenceModules, metadata=REQUIRED)
    # None: an enclosing module that was not itself compared
    error_ratio: float | None = field(default=None, metadata=REQUIRED)
    input_ratio: float | None = None
    same_dtype: float | None = None
    onset_token: int | None = field(default=None, metadata=REQUIRED)
    onset_phase: str | None = None
    evidence: str = field(default="", metadata=REQUIRED)
    summary: str = ""                     # the finding in one line (ekka_core/report/findings.py), every surface's
    rows: list[RowFinding] = field(default_factory=list)      # kind "rows" / "non-finite": the rows named
    non_finite: int = 0                   # kind "non-finite": how many output values are NaN/Inf
    # kind "compiled": the graph nodes whose compiled code departs (each with its engine source line), and the
    # compiler stages whose removal brings the module back within noise (the first is the one named)
    graph_nodes: list[NodeSource] = field(default_factory=list)
    compiler_stages: list[PassFinding] = field(default_factory=list)


# -- plots -----------------------------------------------------------------------------------------------------
@dataclass
class SeriesPoint:
    component: str
    cls: str = field(default="", metadata={"json": "class"})
    error_ratio: float | None = None
    input_ratio: float | None = None
    same_dtype: float | None = None
    input_same_dtype: float | None = None
    order: int = 0
    entered_after: int | None = None


@dataclass
class HeatMap:
    layers: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    ratios: list[list[float | None]] = field(default_factory=list)    # ratios[layer][position]


@dataclass
class Plots:
    series: list[SeriesPoint] = field(default_factory=list)
    change_point: int | None = None       # index into series
    threshold: float = 2.0
    heatmap: HeatMap = field(default_factory=HeatMap)


# -- what was not compared, and inputs that differ ------------------------------------------------------------
@dataclass
class Unchecked:
    module: str
    reason: str


@dataclass
class InputsDiffer:
    """One request whose fed ids differ from the reference's own rendering of the same input."""

    prompt: int                          # request index
    request: str                         # the request's id
    input: str                           # prompt | messages | prompt_token_ids
    position: int                        # first differing position
    fed_from: str
    target: list[int] = field(default_factory=list)          # ids up to a few past the difference
    reference: list[int] = field(default_factory=list)
    target_len: int = 0
    reference_len: int = 0
    target_ids: list[int] = field(default_factory=list)
    reference_ids: list[int] = field(default_factory=list)
    target_tokens: list[str] = field(default_factory=list)   # the tokens around the difference
    reference_tokens: list[str] = field(default_factory=list)
    window_start: int = 0


# -- the run ---------------------------------------------------------------------------------------------------
@dataclass
class EngineInfo:
    framework: str = ""
    version: str = ""
    dtype: str = ""
    attn_implementation: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    resolved_config: dict[str, Any] = field(default_factory=dict)
    config_changes: list[Any] = field(default_factory=list)


@dataclass
class RunMeta:
    ekka_version: str = ""
    target: EngineInfo | None = None
    reference: EngineInfo | None = None
    traces: str | None = None
    reused_traces: bool = False
    seconds: float = 0.0
    culprit_traces: str | None = None
    culprit_target: EngineInfo | None = None
    # An EKKA_INJECT_BUG the diagnosis ran with (a re-injected benchmark bug): never silent in a real diagnosis.
    injected_bug: str | None = None
    remote: dict[str, Any] | None = None      # a diagnosis run on a remote host: where and how (remote.client)


@dataclass
class ServingSection:
    """The configurations the diagnosis ran: the served symptom check, the traced baseline, triage."""

    served_args: dict[str, Any] = field(default_factory=dict)
    served_resolved: dict[str, Any] | None = None
    served: SymptomCheck | None = None
    traced: SymptomCheck | None = None
    traced_args: dict[str, Any] | None = None
    changes: list[ConfigChange] = field(default_factory=list)
    triage: Triage | None = None


@dataclass
class AgentUsage:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    dollars: float = 0.0


@dataclass
class AgentSessionCounts:
    """How the mapping agent's session went: what the agent's outcome keeps and the report's agent section shows."""

    rounds: int = 0                       # validator rounds (finish → problems sent back → …)
    tool_calls: int = 0                   # tool calls the model made
    tool_errors: int = 0                  # … of which answered with an error
    malformed_tool_calls: int = 0         # … of which were malformed (unknown tool, missing or mistyped arguments)
    retries: int = 0                      # API requests retried (429, 5xx, timeouts)
    validator_problems: list[str] = field(default_factory=list)      # what the validator sent back, last round


@dataclass
class AgentSection(AgentSessionCounts):
    """What the mapping agent did (``AgentOutcome.to_report``)."""

    status: str = "nothing-to-do"
    ok: bool = True
    message: str = ""
    model: str = ""
    components: dict[str, int] = field(default_factory=dict)
    mapped: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)
    from_knowledge_base: list[str] = field(default_factory=list)
    unchecked: list[dict[str, str]] = field(default_factory=list)
    usage: AgentUsage = field(default_factory=AgentUsage)
    budget: dict[str, Any] = field(default_factory=dict)
    knowledge_base: dict[str, Any] = field(default_factory=dict)
    aligners: dict[str, Any] = field(default_factory=dict)
    transcript: dict[str, str] | None = None
    events: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# -- bisect ----------------------------------------------------------------------------------------------------
@dataclass
class BisectTried:
    label: str
    verdict: str
    seconds: float                      # this release's diagnosis (capture + analysis), wall clock
    env_seconds: float = 0.0            # building its environment (0 when reused or given)
    env_reused: bool = True
    traces_reused: bool = False
    python: str = ""
    engine_version: str = ""
    top_suspect: str | None = None
    report: str = ""                    # that release's report.json
    error: str = ""                     # verdict "error": why it could not be diagnosed


@dataclass
class BisectChange:
    """One symbol whose source differs between the last good and the first bad release."""

    symbol: str
    kind: str = ""
    status: str = ""
    file_good: str | None = None
    line_good: int | None = None
    file_bad: str | None = None
    line_bad: int | None = None
    calls: list[str] = field(default_factory=list)      # what the symbol calls (qualnames, custom ops)
    unified_diff: str = ""


@dataclass
class BisectSuspect:
    module: str | None = None
    cls: str | None = field(default=None, metadata={"json": "class"})
    file: str | None = None
    line: int | None = None


@dataclass
class BisectFix:
    last_bad: str = ""
    first_good: str = ""
    suspect: BisectSuspect | None = None
    changes: list[BisectChange] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)
    custom_ops: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class BisectSection:
    """``report.bisect`` (schema ``ekka.bisect/1``): the releases tried, the outcome, what changed."""

    schema: str = "ekka.bisect/1"
    package: str | None = None
    candidates: list[str] = field(default_factory=list)
    bad_given: str | None = None
    outcome: str = ""
    last_good: str | None = None
    first_bad: str | None = None
    suspect: BisectSuspect | None = None
    changes: list[BisectChange] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)
    custom_ops: list[str] = field(default_factory=list)
    fix: BisectFix | None = None
    note: str = ""
    tried: list[BisectTried] = field(default_factory=list)
    seconds: float = 0.0


# agrees: looked, and it is within noise · diverges: looked, and it is not · inconclusive: could not look at what
# it needed (``missing`` says what, and the fix) · skipped: not asked in this diagnosis (``words`` says why)
CheckStatus = Literal["agrees", "diverges", "inconclusive", "skipped"]


@dataclass
class CheckRecord:
    """One check as the report lists it."""

    check: str                      # the check's name (its module in ekka_core/checks/)
    status: CheckStatus
    words: str = ""                 # what it found, in one sentence
    compared: int | None = None     # how many things it compared (pairs, positions, requests), where that applies
    missing: list[str] = field(default_factory=list)      # inconclusive: what could not be observed, and the fix
    # The check's own statistic on this run, where it has one (rows: the largest persisting row ratio): what its
    # noise model is measured on (benchmarks/convention_noise.py).
    statistic: float | None = None


# -- the report ------------------------------------------------------------------------------------------------
@dataclass
class Report:
    schema: str = field(default=SCHEMA, metadata=REQUIRED)
    # a report that never got a verdict has not looked
    verdict: Verdict = field(default="inconclusive", metadata=REQUIRED)
    suspects: list[Suspect] = field(default_factory=list, metadata=REQUIRED)
    threshold: float = 2.0
    dtype: str = ""
    spec: DiagnosisSpec | None = None
    meta: RunMeta = field(default_factory=RunMeta)
    checked: int = 0                      # component pairs compared
    unchecked: list[Unchecked] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inputs_differ: list[InputsDiffer] = field(default_factory=list)
    plots: Plots = field(default_factory=Plots)
    serving: ServingSection | None = None
    conventions: list[Suspect] = field(default_factory=list)
    # Why the verdict is inconclusive: what the diagnosis could not observe, each with the fix.
    missing: list[str] = field(default_factory=list)
    checks: list[CheckRecord] = field(default_factory=list)     # every check the diagnosis ran, in order
    agent: AgentSection | None = None
    bisect: BisectSection | None = None
    # In-graph localisation of a compile-only divergence (triage found compilation makes the difference): the
    # compiled-vs-eager ratio of every piece of the engine's compiled graph, the suspect, its nodes and pass.
    graph: GraphLocalisation | None = None

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "Report":
        return from_json(Report, data)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @staticmethod
    def load(path: Path) -> "Report":
        return Report.from_json(json.loads(Path(path).read_text()))

    @property
    def top(self) -> Suspect | None:
        return self.suspects[0] if self.suspects else None


def report_schema() -> dict[str, Any]:
    """The JSON Schema of report.json, generated from :class:`Report`."""
    return json_schema(Report, schema_id=SCHEMA)


# -- words -----------------------------------------------------------------------------------------------------
def fmt_ratio(r: float | None) -> str:
    """An error ratio as people read it: 3 significant digits below 10, one decimal below 1000, then grouped."""
    if r is None or (isinstance(r, float) and not math.isfinite(r)):
        return "n/a"
    if r >= 1e6:
        return f"{r:.2e}"
    if r >= 1000:
        return f"{r:,.0f}"
    if r >= 10:
        return f"{r:.1f}"
    return f"{r:.3g}"


def headline(report: Report) -> str:
    """The verdict in one sentence (CLI, report.md/html, the editor)."""
    words = _verdict_sentence(report)
    if report.meta.injected_bug:
        # loud on every surface: a variable left in a shell must never pass for the engine's own behaviour
        words += f" [the engine ran with Ekka's re-injected benchmark bug {report.meta.injected_bug!r}]"
    return words


def _verdict_sentence(report: Report) -> str:
    v = report.verdict
    triage = report.serving.triage if report.serving else None
    only = f" — {triage.words}" if triage and triage.culprit and triage.words else ""
    s = report.top
    served = report.serving.served if report.serving else None
    # equal, not identical: the one-run case (served = traced baseline) survives a JSON round trip as two equal checks
    if not only and served is not None and not served.diverges and served != report.serving.traced:
        # what users run does not show it: a traced-only finding must not read like the served engine's bug
        only = (f" — in the traced baseline only: the served configuration matches the reference at the output "
                f"level (ratio {fmt_ratio(served.ratio)})")
    if v == "divergent" and s is not None:
        onset = f", from token {s.onset_token}" if s.onset_token is not None else ""
        what = f"{s.summary}" if s.summary else f"error ratio {s.error_ratio}{onset}"
        return f"divergent: {s.target.module} ({s.target.cls}) departs from the reference ({what}){only}"
    if v == "divergent":
        return (f"divergent: the served configuration departs from the reference at the output level (ratio "
                f"{fmt_ratio(served.ratio if served else None)}){only or '; no traced module explains it'}")
    if v == "inputs-differ":
        d = report.inputs_differ[0] if report.inputs_differ else None
        if d is None:
            return "inputs-differ: the engine fed other token ids than the reference makes; no tensor was compared"
        return (f"inputs-differ: the engine fed request {d.request!r} other token ids than the reference makes of "
                f"the same {d.input} (first difference at token {d.position}); no tensor was compared")
    if v == "inconclusive":
        return "inconclusive: " + ("; ".join(report.missing) or "the evidence needed for a verdict is missing")
    return f"consistent within numerical noise (threshold {report.threshold}) on {coverage_words(report)}"


# Below this fraction of an engine's components compared, a verdict is partial — said so wherever the verdict is. The
# architecture sweep (`ekka bench --archs`, benchmarks/latest-archs.md) measures every zoo architecture at 98.1–98.5%
# (51/52 … 67/68: all but the model root, which is compared piecewise); 0.95 leaves a smaller tree its one root entry.
KNOWN_COVERAGE = 0.95


def coverage_words(report: Report) -> str:
    """"63 of 71 components; 8 not compared: a, b, … (listed)", and "partial" below :data:`KNOWN_COVERAGE`."""
    total = report.checked + len(report.unchecked)
    words = f"{report.checked} of {total} components"
    if report.unchecked:
        names = ", ".join(u.module or "<root>" for u in report.unchecked[:3])
        more = f" and {len(report.unchecked) - 3} more" if len(report.unchecked) > 3 else ""
        words += f"; {len(report.unchecked)} not compared: {names}{more} (listed)"
    if total and report.checked / total < KNOWN_COVERAGE:
        words += (f" — partial: {report.checked / total:.0%} compared, below the {KNOWN_COVERAGE:.0%} Ekka compares "
                  f"on the architectures it knows")
    return words


def short_headline(report: Report) -> str:
    """The verdict in a few words, for a status line (the editor's job message): the rank-1 suspect when divergent,
    else the verdict."""
    s = report.top
    if report.verdict == "divergent" and s is not None:
        return f"divergent: #1 {s.target.module} ({s.target.cls}), error ratio {fmt_ratio(s.error_ratio)}×"
    if report.verdict == "inconclusive":
        unobserved = [c.check for c in report.checks if c.status == "inconclusive"]
        return "inconclusive: could not observe " + (", ".join(unobserved) or "what a verdict needs")
    return report.verdict
