"""The report contract (``ekka.report/1``, DESIGN.md) and what every shell says about a report.

``report.json`` holds at least ``schema``, ``verdict`` and ``suspects`` (rank, target module/class/file/line,
reference modules, error ratio, onset token, evidence); later fields are additions, never changes.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "ekka.report/1"
VERDICTS = ("divergent", "consistent", "inputs-differ")


def headline(report: dict[str, Any]) -> str:
    v = report["verdict"]
    if v == "divergent" and report["suspects"]:
        s = report["suspects"][0]
        onset = f", from token {s['onset_token']}" if s["onset_token"] is not None else ""
        return (f"divergent: {s['target']['module']} ({s['target']['class']}) departs from the reference "
                f"(error ratio {s['error_ratio']}{onset})")
    if v == "inputs-differ":
        return "inputs-differ: the frameworks tokenise the prompt differently; no tensor was compared"
    return f"consistent: {report['checked']} components within numerical noise (threshold {report['threshold']})"
