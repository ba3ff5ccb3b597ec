"""Report → what the editor shows: diagnostics, code lenses and hovers on the engine's source lines.

Pure functions over the report dict (``ekka.report/1``) and the worker's module → class-location map; no LSP I/O
and no engine import, so they are cheap to call on every request.

Lines: the report's lines are 1-based (``class Attention`` at line 229); LSP lines are 0-based (228).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from lsprotocol import types

from ekka_core.contracts.report import fmt_ratio

from server.protocol import (CLIENT_SHOW_DIVERGENCE, CLIENT_SHOW_RELEASE_DIFF, CODE_SUSPECT, CODE_SUSPECT_CALL,
                             CODE_SUSPECT_FORWARD, DIAGNOSTIC_SOURCE)

CODES = {"class": CODE_SUSPECT, "forward": CODE_SUSPECT_FORWARD, "call": CODE_SUSPECT_CALL}

SPARKS = "▁▂▃▄▅▆▇█"
MAX_HOVER_ROWS = 48


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
    kind: str             # "class" | "forward" | "call"
    suspects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return min(s["rank"] for s in self.suspects)


@dataclass
class Result:
    """A finished diagnosis as the server keeps it."""

    job_id: str
    report: dict[str, Any]
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    out_dir: str | None = None
    uri: str | None = None
    marks: list[Mark] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.marks = suspect_marks(self.report)

    def files(self) -> dict[str, str]:
        """path_key → the report's spelling, for every file with a diagnostic."""
        return {path_key(m.path): m.path for m in self.marks}


def suspect_marks(report: dict[str, Any]) -> list[Mark]:
    marks: dict[tuple[str, int, str], Mark] = {}
    for s in report.get("suspects", []):
        t = s.get("target") or {}
        places = [("class", t.get("file"), t.get("line"))]
        # A forward inherited from elsewhere (vLLM's CustomOp.forward dispatcher) says nothing about this class.
        if t.get("forward_file") and t.get("forward_line") and t.get("forward_file") == t.get("file"):
            places.append(("forward", t["forward_file"], t["forward_line"]))
        # Where the parent's forward calls this module (``self.attn(q, k, v)``), when the engine located it.
        if t.get("call_file") and t.get("call_line"):
            places.append(("call", t["call_file"], t["call_line"]))
        for kind, path, line in places:
            if not path or not isinstance(line, int) or line < 1:
                continue
            key = (path_key(path), line - 1, kind)
            marks.setdefault(key, Mark(path, line - 1, kind)).suspects.append(s)
    return sorted(marks.values(), key=lambda m: (m.rank, m.path, m.line))


def _onset(s: dict[str, Any]) -> str:
    if s.get("onset_token") is None:
        return ""
    phase = f" ({s['onset_phase']})" if s.get("onset_phase") else ""
    return f", diverges from token {s['onset_token']}{phase}"


def suspect_message(s: dict[str, Any], threshold: Any, where: str = "") -> str:
    t = s["target"]
    refs = ", ".join((s.get("reference") or {}).get("modules") or []) or "none"
    return (f"Ekka #{s['rank']}{where}: {t['module']} ({t['class']}) departs from the reference — error ratio "
            f"{fmt_ratio(s.get('error_ratio'))}× (threshold {threshold}){_onset(s)}; reference module(s): {refs}")


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _value(v: Any) -> str:
    """An engine argument's value as JSON spells it (``true``, ``64``, ``["none"]``)."""
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return str(v)


def serving_suffix(report: dict[str, Any]) -> str:
    """`` (served: diverges only with batching on)`` for the diagnostics when configuration triage found the served
    features that make the served configuration diverge; empty otherwise."""
    triage = _dict(_dict(report.get("serving")).get("triage"))
    culprit = [str(f) for f in triage.get("culprit") or []]
    if triage.get("direction") != "served-diverges" or not culprit:
        return ""
    return f" (served: diverges only with {' + '.join(culprit)} on)"


def serving_line(report: dict[str, Any]) -> str | None:
    """One Markdown line for the hover: does the served configuration diverge (triage's words), and under which
    configuration the ratios shown were traced. None for a report without a ``serving`` section."""
    serving = report.get("serving")
    if not isinstance(serving, dict):
        return None
    triage = _dict(serving.get("triage"))
    served = _dict(serving.get("served")) or _dict(triage.get("served"))
    if served:
        ratio = fmt_ratio(served.get("ratio"))
        head = (f"**Diverges in the served configuration** (ratio {ratio}×)" if served.get("diverges") else
                f"**The served configuration matches the reference** (ratio {ratio}×)")
    else:
        head = "**The served configuration was not checked**"
    parts = [head + (f" — configuration triage: {triage['words']}" if triage.get("words") else "")]
    baseline = "the eager baseline" if _dict(serving.get("traced_args")).get("enforce_eager") else "the traced baseline"
    under = [str(f) for f in triage.get("traced_under") or []]
    changes = [c for c in serving.get("changes") or [] if isinstance(c, dict) and c.get("arg")]
    if under:
        differing = _dict(triage.get("differing"))
        feats = []
        for f in under:
            d = _dict(differing.get(f))
            both = "served" in d and "baseline" in d
            feats.append(f"`{f}` as served" + (f" ({_value(d['served'])}; baseline {_value(d['baseline'])})" if both else ""))
        parts.append(f"traced under: {baseline} + " + ", ".join(feats))
    elif changes:
        shown = ", ".join(f"`{c['arg']}={_value(c.get('traced'))}`" for c in changes[:4])
        parts.append(f"traced under: {baseline} ({shown}{', …' if len(changes) > 4 else ''})")
    else:
        parts.append("traced under: the served configuration itself (nothing changed for tracing)")
    untraceable = [str(f) for f in triage.get("untraceable") or []]
    if untraceable:
        parts.append(f"hooks cannot see into {', '.join(untraceable)}")
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
    """path_key → diagnostics on that file (class lines and own forward lines of the suspects)."""
    thr = result.report.get("threshold")
    suffix = serving_suffix(result.report)
    out: dict[str, list[types.Diagnostic]] = {}
    for m in result.marks:
        lead, *others = sorted(m.suspects, key=lambda s: s["rank"])
        where = {"class": "", "forward": f" (forward of {lead['target']['class']})", "call": " (called here)"}
        msg = suspect_message(lead, thr, where[m.kind])
        if others:
            msg += "; also " + "; ".join(f"#{s['rank']} {s['target']['module']} (ratio {fmt_ratio(s.get('error_ratio'))}×)"
                                         for s in others)
        msg += suffix
        out.setdefault(path_key(m.path), []).append(types.Diagnostic(
            range=_line_range(m.line, line_text(m.path, m.line)), message=msg, severity=severity(m.rank),
            source=DIAGNOSTIC_SOURCE, code=CODES[m.kind],
            data={"jobId": result.job_id, "rank": lead["rank"], "module": lead["target"]["module"]}))
    return out


def lens_title(s: dict[str, Any]) -> str:
    parts = [f"Ekka #{s['rank']}", f"ratio {fmt_ratio(s.get('error_ratio'))}×"]
    if s.get("onset_token") is not None:
        parts.append(f"diverges from token {s['onset_token']}")
    return " · ".join(parts + ["Show divergence"])


def release_bisection(report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's ``bisect`` section when it found the release that broke it (last good and first bad)."""
    b = report.get("bisect")
    if isinstance(b, dict) and b.get("outcome") == "regression-found" and b.get("first_bad") and b.get("last_good"):
        return b
    return None


def release_lens_title(b: dict[str, Any], status: str | None = None) -> str:
    """``changed in 1.1 (last good 1.0) · Show diff`` (a changed symbol: ``added in …`` when it is new)."""
    if status is None and not b.get("changes"):
        return f"first bad {b['first_bad']} (last good {b['last_good']}) · Show bisection"
    verb = "added" if status == "added" else "changed"
    return f"{verb} in {b['first_bad']} (last good {b['last_good']}) · Show diff"


def _bisect_suspect(result: Result, b: dict[str, Any]) -> tuple[str, int] | None:
    """(path, 0-based line) of the class the bisection names: its suspect (the first bad release's rank 1)."""
    module = _dict(b.get("suspect")).get("module")
    suspects = sorted(result.report.get("suspects", []), key=lambda s: s["rank"])
    named = [s for s in suspects if module and s["target"]["module"] == module] or suspects[:1]
    t = named[0]["target"] if named else _dict(b.get("suspect"))
    if t.get("file") and isinstance(t.get("line"), int) and t["line"] >= 1:
        return t["file"], t["line"] - 1
    return None


def code_lenses(result: Result, key: str, line_text: LineText) -> list[types.CodeLens]:
    lenses = []
    b = release_bisection(result.report)
    at = _bisect_suspect(result, b) if b else None
    release_at = (path_key(at[0]), at[1]) if at else None
    for m in result.marks:
        if m.kind != "class" or path_key(m.path) != key:
            continue
        for s in sorted(m.suspects, key=lambda s: s["rank"]):
            lenses.append(types.CodeLens(
                range=_line_range(m.line, line_text(m.path, m.line)),
                command=types.Command(title=lens_title(s), command=CLIENT_SHOW_DIVERGENCE,
                                      arguments=[{"jobId": result.job_id, "module": s["target"]["module"]}])))
    if b is None:
        return lenses
    if at is not None and release_at == (key, at[1]):
        lenses.append(types.CodeLens(
            range=_line_range(at[1], line_text(at[0], at[1])),
            command=types.Command(title=release_lens_title(b), command=CLIENT_SHOW_RELEASE_DIFF,
                                  arguments=[{"jobId": result.job_id}])))
    for c in b.get("changes") or []:
        file, line = c.get("file_bad"), c.get("line_bad")
        if not file or not isinstance(line, int) or line < 1 or path_key(file) != key:
            continue
        if release_at == (key, line - 1):      # the suspect's class line has its lens already
            continue
        lenses.append(types.CodeLens(
            range=_line_range(line - 1, line_text(file, line - 1)),
            command=types.Command(title=release_lens_title(b, c.get("status") or "changed"),
                                  command=CLIENT_SHOW_RELEASE_DIFF,
                                  arguments=[{"jobId": result.job_id, "symbol": c.get("symbol")}])))
    return lenses


def _locations(result: Result) -> dict[str, dict[str, Any]]:
    """module → {class, file, line, forward_file, forward_line}: the worker's map, completed by the suspects."""
    locs = dict(result.modules)
    for s in result.report.get("suspects", []):
        t = s["target"]
        locs.setdefault(t["module"], {"class": t["class"], "file": t.get("file"), "line": t.get("line"),
                                      "forward_file": t.get("forward_file"), "forward_line": t.get("forward_line")})
    return locs


def hover(result: Result, key: str, line: int) -> types.Hover | None:
    """Markdown for a class (or its own forward) line of a compared module: error ratio per module of that class."""
    locs = _locations(result)
    hit: tuple[str, str] | None = None   # (class name, class file key)
    for loc in locs.values():
        for f, ln in ((loc.get("file"), loc.get("line")),
                      (loc.get("forward_file") if loc.get("forward_file") == loc.get("file") else None,
                       loc.get("forward_line"))):
            if f and isinstance(ln, int) and ln - 1 == line and path_key(f) == key:
                hit = (loc["class"], path_key(loc["file"]))
                break
        if hit:
            break
    if hit is None:
        return None
    cls, cls_key = hit
    same = lambda mod: (mod in locs and locs[mod].get("class") == cls  # noqa: E731
                        and locs[mod].get("file") and path_key(locs[mod]["file"]) == cls_key)
    rows = [s for s in result.report.get("plots", {}).get("series", []) if same(s["component"])]
    suspects = [s for s in result.report.get("suspects", []) if same(s["target"]["module"])]
    thr = result.report.get("threshold")
    lines = [f"**Ekka** · `{cls}` · {result.report.get('verdict', '?')} (job {result.job_id})", ""]
    served = serving_line(result.report)
    if served:
        lines += [served, ""]
    for s in suspects:
        lines.append(f"- suspect **#{s['rank']}** `{s['target']['module']}`: error ratio "
                     f"{fmt_ratio(s.get('error_ratio'))}×{_onset(s)}")
    if suspects:
        lines.append("")
    if rows:
        lines += ["| module | error ratio |", "|:--|--:|"]
        for r in rows[:MAX_HOVER_ROWS]:
            ratio = fmt_ratio(r.get("error_ratio"))
            above = thr is not None and r.get("error_ratio") is not None and r["error_ratio"] > thr
            lines.append(f"| `{r['component']}` | {'**' + ratio + '** ⚠' if above else ratio} |")
        if len(rows) > MAX_HOVER_ROWS:
            lines.append(f"| … {len(rows) - MAX_HOVER_ROWS} more | |")
        lines += ["", f"Along the layers: `{sparkline([r.get('error_ratio') for r in rows], thr)}` "
                      f"(error ratio, log scale; threshold {thr})"]
    else:
        lines.append("_No compared module of this class._")
    return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n".join(lines)))
