"""The report contract (``ekka.report/1``, DESIGN.md) and what every shell says about a report.

``report.json`` holds at least ``schema``, ``verdict`` and ``suspects`` (rank, target module/class/file/line,
reference modules, error ratio, onset token, evidence); later fields are additions, never changes.
"""

from __future__ import annotations

import math
from typing import Any

SCHEMA = "ekka.report/1"
VERDICTS = ("divergent", "consistent", "inputs-differ")


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


def headline(report: dict[str, Any]) -> str:
    """The verdict in one sentence (CLI, report.md/html)."""
    v = report["verdict"]
    triage = ((report.get("serving") or {}).get("triage") or {})
    only = f" — {triage['words']}" if triage.get("culprit") and triage.get("words") else ""
    if v == "divergent" and report["suspects"]:
        s = report["suspects"][0]
        onset = f", from token {s['onset_token']}" if s["onset_token"] is not None else ""
        return (f"divergent: {s['target']['module']} ({s['target']['class']}) departs from the reference "
                f"(error ratio {s['error_ratio']}{onset}){only}")
    if v == "divergent":
        served = (report.get("serving") or {}).get("served") or {}
        return (f"divergent: the served configuration departs from the reference at the output level (ratio "
                f"{fmt_ratio(served.get('ratio'))}){only or '; no traced module explains it'}")
    if v == "inputs-differ":
        d = (report.get("inputs_differ") or [{}])[0]
        return (f"inputs-differ: the engine fed request {d.get('request', d.get('prompt', '?'))!r} other token ids "
                f"than the reference makes of the same {d.get('input', 'input')} (first difference at token "
                f"{d.get('position', '?')}); no tensor was compared")
    return f"consistent: {report['checked']} components within numerical noise (threshold {report['threshold']})"


def short_headline(report: dict[str, Any]) -> str:
    """The verdict in a few words, for a status line (the editor's job message): the rank-1 suspect when divergent,
    else the verdict."""
    v = report.get("verdict")
    if v == "divergent" and report.get("suspects"):
        s = report["suspects"][0]
        return (f"divergent: #1 {s['target']['module']} ({s['target']['class']}), error ratio "
                f"{fmt_ratio(s.get('error_ratio'))}×")
    return str(v)
