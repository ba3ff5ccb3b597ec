"""Report → what the editor shows: diagnostics, code lenses and hovers on the engine's source lines.

Pure functions over the typed report (:class:`~ekka_core.contracts.report.Report`, read once from the worker's
JSON in :mod:`server.jobs`) and the worker's module → class-location map; no LSP I/O and no engine import, so they
are cheap to call on every request.

Lines: the report's lines are 1-based (``class Attention`` at line 229); LSP lines are 0-based (228).

Words: a finding's one line is the report's ``Suspect.summary`` (rendered by :mod:`ekka_core.report.findings`, the one
rendering source); what was and was not observed is :func:`ekka_core.report.coverage.coverage`'s sections, here cut
short for a hover and sent whole to the editor (:func:`rendered`, which renders none of it itself). An
``inconclusive`` report publishes no diagnostics (it found nothing; it could not look); its hover says so, and why.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from lsprotocol import types

from ekka_core.contracts.report import BisectSection, Report, Suspect, TargetLocation, fmt_ratio, short_headline
from ekka_core.report.coverage import CoverageSection, coverage, coverage_line
from ekka_core.report.findings import summary

from server.protocol import (CLIENT_SHOW_DIVERGENCE, CLIENT_SHOW_RELEASE_DIFF, CODE_SUSPECT, CODE_SUSPECT_CALL,
                             CODE_SUSPECT_FORWARD, CODE_SUSPECT_GRAPH_NODE, DIAGNOSTIC_SOURCE)

CODES = {"class": CODE_SUSPECT, "forward": CODE_SUSPECT_FORWARD, "call": CODE_SUSPECT_CALL,
         "node": CODE_SUSPECT_GRAPH_NODE}

SPARKS = "▁▂▃▄▅▆▇█"
MAX_HOVER_ROWS = 48
MAX_HOVER_COVERAGE = 3      # items shown per coverage section in a hover (what was not observed and the checks: all)


def path_key(path: str) -> str:
    """One key per file however it is spelled (symlinks, ``..``): the client's URI and the report's path meet here."""
    return os.path.normcase(os.path.realpath(path))


def severity(rank: int) -> types.DiagnosticSeverity:
    if rank <= 1:
        return types.DiagnosticSeverity.Error
    if rank == 2:
        return types.DiagnosticSeverity.Warning
    return types.DiagnosticSeverity.Information


def sparkline(values: Iterable[float | None], threshold: float | None = None) -> str:
    """Unicode sparkline on a log scale (ratios span orders of magnitude); missing values are blank."""
    vals = list(values)
    logs = [math.log10(max(v, 1e-6)) for v in vals if v is not None and math.isfinite(v)]
    if not logs:
        return " " * len(vals)
    lo, hi = min(logs + [0.0]), max(logs + [math.log10(threshold) if threshold else 0.0])
    span = hi - lo or 1.0
    out = []
    for v in vals:
        if v is None or not math.isfinite(v):
            out.append(" ")
            continue
        x = (math.log10(max(v, 1e-6)) - lo) / span
        out.append(SPARKS[min(len(SPARKS) - 1, max(0, int(round(x * (len(SPARKS) - 1)))))])
    return "".join(out)


@dataclass
class Mark:
    """One source line that one or more suspects point at."""

    path: str             # as the report spells it (published under this path's URI)
    line: int             # 0-based
    kind: str             # "class" | "forward" | "call" | "node" (a compiled suspect's graph node)
    suspects: list[Suspect] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return min(s.rank for s in self.suspects)


@dataclass
class Result:
    """A finished diagnosis as the server keeps it."""

    job_id: str
    report: Report
    modules: dict[str, TargetLocation] = field(default_factory=dict)     # the worker's class locations
    paths: dict[str, str] = field(default_factory=dict)
    out_dir: str | None = None
    uri: str | None = None
    marks: list[Mark] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.marks = suspect_marks(self.report)

    def files(self) -> dict[str, str]:
        """path_key → the report's spelling, for every file with a diagnostic."""
        return {path_key(m.path): m.path for m in self.marks}


def suspect_marks(report: Report) -> list[Mark]:
    marks: dict[tuple[str, int, str], Mark] = {}
    for s in report.suspects:
        t = s.target
        places = [("class", t.file, t.line)]
        # A forward inherited from elsewhere (vLLM's CustomOp.forward dispatcher) says nothing about this class.
        if t.forward_file and t.forward_line and t.forward_file == t.file:
            places.append(("forward", t.forward_file, t.forward_line))
        # Where the parent's forward calls this module (``self.attn(q, k, v)``), when the engine located it.
        if t.call_file and t.call_line:
            places.append(("call", t.call_file, t.call_line))
        # A compiled suspect: the source lines its departing graph nodes were traced from.
        places += [("node", n.file, n.line) for n in s.graph_nodes if n.file and n.line]
        for kind, path, line in places:
            if not path or not isinstance(line, int) or line < 1:
                continue
            key = (path_key(path), line - 1, kind)
            marks.setdefault(key, Mark(path, line - 1, kind)).suspects.append(s)
    return sorted(marks.values(), key=lambda m: (m.rank, m.path, m.line))


def finding(s: Suspect) -> str:
    """The finding in one line: the report's ``summary`` (a report from before it: rendered the same way here)."""
    return s.summary or summary(s)


def _kind(s: Suspect) -> str:
    return "" if s.kind == "module" else f" [{s.kind}]"


def suspect_message(s: Suspect, threshold: float, where: str = "") -> str:
    t = s.target
    refs = ", ".join(s.reference.modules) or "none"
    return (f"Ekka #{s.rank}{where}: {t.module} ({t.cls}){_kind(s)} — {finding(s)} (threshold {threshold}); "
            f"reference module(s): {refs}")


def _value(v: Any) -> str:
    """An engine argument's value as JSON spells it (``true``, ``64``, ``["none"]``)."""
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return str(v)


def serving_suffix(report: Report) -> str:
    """`` (served: diverges only with batching on)`` for the diagnostics when configuration triage found the served
    features that make the served configuration diverge; empty otherwise."""
    triage = report.serving.triage if report.serving else None
    if triage is None or triage.direction != "served-diverges" or not triage.culprit:
        return ""
    return f" (served: diverges only with {' + '.join(triage.culprit)} on)"


def serving_line(report: Report) -> str | None:
    """One Markdown line for the hover: does the served configuration diverge (triage's words), and under which
    configuration the ratios shown were traced. None for a report without a ``serving`` section."""
    serving = report.serving
    if serving is None:
        return None
    triage = serving.triage
    served = serving.served or (triage.served if triage else None)
    if served:
        ratio = fmt_ratio(served.ratio)
        head = (f"**Diverges in the served configuration** (ratio {ratio}×)" if served.diverges else
                f"**The served configuration matches the reference** (ratio {ratio}×)")
    else:
        head = "**The served configuration was not checked**"
    parts = [head + (f" — configuration triage: {triage.words}" if triage and triage.words else "")]
    baseline = "the eager baseline" if (serving.traced_args or {}).get("enforce_eager") else "the traced baseline"
    under = triage.traced_under if triage else []
    changes = [c for c in serving.changes if c.arg]
    if under:
        feats = []
        for f in under:
            d = triage.differing.get(f)
            feats.append(f"`{f}` as served" + (f" ({_value(d.served)}; baseline {_value(d.baseline)})" if d else ""))
        parts.append(f"traced under: {baseline} + " + ", ".join(feats))
    elif changes:
        shown = ", ".join(f"`{c.arg}={_value(c.traced)}`" for c in changes[:4])
        parts.append(f"traced under: {baseline} ({shown}{', …' if len(changes) > 4 else ''})")
    else:
        parts.append("traced under: the served configuration itself (nothing changed for tracing)")
    if triage and triage.untraceable:
        parts.append(f"hooks cannot see into {', '.join(triage.untraceable)}")
    return "; ".join(parts)


LineText = Callable[[str, int], str | None]


def _line_range(line: int, text: str | None) -> types.Range:
    """The whole line, from its first non-blank character, in UTF-16 code units (LSP's default encoding)."""
    if text is None:
        return types.Range(start=types.Position(line=line, character=0), end=types.Position(line=line, character=0))
    stripped = text.rstrip("\r\n")
    start = len(stripped) - len(stripped.lstrip())
    u16 = lambda s: len(s.encode("utf-16-le")) // 2  # noqa: E731
    return types.Range(start=types.Position(line=line, character=u16(stripped[:start])),
                       end=types.Position(line=line, character=u16(stripped)))


def diagnostics(result: Result, line_text: LineText) -> dict[str, list[types.Diagnostic]]:
    """path_key → diagnostics on that file (class lines and own forward lines of the suspects); none for an
    inconclusive report (it could not look, so nothing in the source is to blame)."""
    thr = result.report.threshold
    suffix = serving_suffix(result.report)
    out: dict[str, list[types.Diagnostic]] = {}
    if result.report.verdict == "inconclusive":
        return out
    for m in result.marks:
        lead, *others = sorted(m.suspects, key=lambda s: s.rank)
        where = {"class": "", "forward": f" (forward of {lead.target.cls})", "call": " (called here)",
                 "node": " (compiled graph node traced from this line)"}
        msg = suspect_message(lead, thr, where[m.kind])
        if others:
            msg += "; also " + "; ".join(f"#{s.rank} {s.target.module} (ratio {fmt_ratio(s.error_ratio)}×)"
                                         for s in others)
        msg += suffix
        out.setdefault(path_key(m.path), []).append(types.Diagnostic(
            range=_line_range(m.line, line_text(m.path, m.line)), message=msg, severity=severity(m.rank),
            source=DIAGNOSTIC_SOURCE, code=CODES[m.kind],
            data={"jobId": result.job_id, "rank": lead.rank, "module": lead.target.module}))
    return out


def lens_title(s: Suspect) -> str:
    parts = [f"Ekka #{s.rank}", f"ratio {fmt_ratio(s.error_ratio)}×"]
    if s.onset_token is not None:
        parts.append(f"diverges from token {s.onset_token}")
    return " · ".join(parts + ["Show divergence"])


def release_bisection(report: Report) -> BisectSection | None:
    """The report's ``bisect`` section when it found the release that broke it (last good and first bad)."""
    b = report.bisect
    if b is not None and b.outcome == "regression-found" and b.first_bad and b.last_good:
        return b
    return None


def release_lens_title(b: BisectSection, status: str | None = None) -> str:
    """``changed in 1.1 (last good 1.0) · Show diff`` (a changed symbol: ``added in …`` when it is new)."""
    if status is None and not b.changes:
        return f"first bad {b.first_bad} (last good {b.last_good}) · Show bisection"
    verb = "added" if status == "added" else "changed"
    return f"{verb} in {b.first_bad} (last good {b.last_good}) · Show diff"


def _bisect_suspect(result: Result, b: BisectSection) -> tuple[str, int] | None:
    """(path, 0-based line) of the class the bisection names: its suspect (the first bad release's rank 1)."""
    module = b.suspect.module if b.suspect else None
    suspects = sorted(result.report.suspects, key=lambda s: s.rank)
    named = [s for s in suspects if module and s.target.module == module] or suspects[:1]
    t = named[0].target if named else b.suspect
    if t is not None and t.file and isinstance(t.line, int) and t.line >= 1:
        return t.file, t.line - 1
    return None


def code_lenses(result: Result, key: str, line_text: LineText) -> list[types.CodeLens]:
    lenses = []
    b = release_bisection(result.report)
    at = _bisect_suspect(result, b) if b else None
    release_at = (path_key(at[0]), at[1]) if at else None
    for m in result.marks:
        if m.kind != "class" or path_key(m.path) != key:
            continue
        for s in sorted(m.suspects, key=lambda s: s.rank):
            lenses.append(types.CodeLens(
                range=_line_range(m.line, line_text(m.path, m.line)),
                command=types.Command(title=lens_title(s), command=CLIENT_SHOW_DIVERGENCE,
                                      arguments=[{"jobId": result.job_id, "module": s.target.module}])))
    if b is None:
        return lenses
    if at is not None and release_at == (key, at[1]):
        lenses.append(types.CodeLens(
            range=_line_range(at[1], line_text(at[0], at[1])),
            command=types.Command(title=release_lens_title(b), command=CLIENT_SHOW_RELEASE_DIFF,
                                  arguments=[{"jobId": result.job_id}])))
    for c in b.changes:
        file, line = c.file_bad, c.line_bad
        if not file or not isinstance(line, int) or line < 1 or path_key(file) != key:
            continue
        if release_at == (key, line - 1):      # the suspect's class line has its lens already
            continue
        lenses.append(types.CodeLens(
            range=_line_range(line - 1, line_text(file, line - 1)),
            command=types.Command(title=release_lens_title(b, c.status or "changed"),
                                  command=CLIENT_SHOW_RELEASE_DIFF,
                                  arguments=[{"jobId": result.job_id, "symbol": c.symbol}])))
    return lenses


def rendered(report: Report) -> dict[str, Any]:
    """What ``ekka/reportUpdated`` carries next to the report, in Python's words, so that the editor shows them
    verbatim and renders nothing itself: ``headline`` (:func:`~ekka_core.contracts.report.short_headline`, also the
    job's message), ``coverage`` (:func:`~ekka_core.report.coverage.coverage`'s sections as ``{key, title, items:
    [{label, text}]}``) and ``coverageLine`` (:func:`~ekka_core.report.coverage.coverage_line`)."""
    return {
        "headline": short_headline(report),
        "coverage": [{"key": s.key, "title": s.title,
                      "items": [{"label": label, "text": text} for label, text in s.items]} for s in coverage(report)],
        "coverageLine": coverage_line(report),
    }


def _coverage_item(section: CoverageSection, label: str, text: str) -> str:
    if not label:
        return f"- {text}"
    return f"- `{label}`: {text}" if section.key in ("unchecked", "conventions") else f"- {label}: {text}"


def coverage_hover(report: Report, keys: Iterable[str]) -> list[str]:
    """Markdown lines for the hover: the report's coverage sections named in ``keys`` (in the report's order), each
    cut to its first few items with the count left — except what was not observed and the checks, never cut."""
    lines: list[str] = []
    wanted = set(keys)
    for section in coverage(report):
        if section.key not in wanted:
            continue
        whole = section.key in ("missing", "checks")
        shown = section.items if whole else section.items[:MAX_HOVER_COVERAGE]
        lines += [f"**{section.title}**", ""] + [_coverage_item(section, label, text) for label, text in shown]
        if len(shown) < len(section.items):
            lines.append(f"- … and {len(section.items) - len(shown)} more (report.md)")
        lines.append("")
    return lines


def _locations(result: Result) -> dict[str, TargetLocation]:
    """module → where its class is defined: the worker's map, completed by the suspects."""
    locs = dict(result.modules)
    for s in result.report.suspects:
        locs.setdefault(s.target.module, s.target)
    return locs


def hover(result: Result, key: str, line: int) -> types.Hover | None:
    """Markdown for a class (or its own forward) line of a compared module: error ratio per module of that class."""
    locs = _locations(result)
    hit: tuple[str, str] | None = None   # (class name, class file key)
    for loc in locs.values():
        own_forward = loc.forward_file if loc.forward_file == loc.file else None
        for f, ln in ((loc.file, loc.line), (own_forward, loc.forward_line)):
            if f and loc.file and isinstance(ln, int) and ln - 1 == line and path_key(f) == key:
                hit = (loc.cls, path_key(loc.file))
                break
        if hit:
            break
    if hit is None:
        return None
    cls, cls_key = hit
    same = lambda mod: (mod in locs and locs[mod].cls == cls  # noqa: E731
                        and bool(locs[mod].file) and path_key(locs[mod].file) == cls_key)
    report = result.report
    rows = [p for p in report.plots.series if same(p.component)]
    suspects = [s for s in report.suspects if same(s.target.module)]
    thr = report.threshold
    lines = [f"**Ekka** · `{cls}` · {report.verdict} (job {result.job_id})", ""]
    if report.verdict == "inconclusive":
        lines += ["**Inconclusive**: the diagnosis could not observe what a verdict needs (below, each with its fix); "
                  "it says neither that the engine agrees nor that it does not.", ""]
    served = serving_line(report)
    if served:
        lines += [served, ""]
    lines += coverage_hover(report, ["missing"])
    for s in suspects:
        lines.append(f"- suspect **#{s.rank}** `{s.target.module}`{_kind(s)}: {finding(s)}")
    if suspects:
        lines.append("")
    if rows:
        lines += ["| module | error ratio |", "|:--|--:|"]
        for r in rows[:MAX_HOVER_ROWS]:
            ratio = fmt_ratio(r.error_ratio)
            above = r.error_ratio is not None and r.error_ratio > thr
            lines.append(f"| `{r.component}` | {'**' + ratio + '** ⚠' if above else ratio} |")
        if len(rows) > MAX_HOVER_ROWS:
            lines.append(f"| … {len(rows) - MAX_HOVER_ROWS} more | |")
        lines += ["", f"Along the layers: `{sparkline([r.error_ratio for r in rows], thr)}` "
                      f"(error ratio, log scale; threshold {thr})"]
    else:
        lines.append("_No compared module of this class._")
    rest = coverage_hover(report, ["checks", "conventions", "unchecked", "notes"])
    if rest:
        lines += [""] + rest[:-1]
    return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n".join(lines)))
