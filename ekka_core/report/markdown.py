"""report.md: the verdict, the suspects' table, the serving configurations, coverage and the mapping agent."""

from __future__ import annotations

from ekka_core.contracts.report import Report, headline
from ekka_core.report.coverage import coverage_line, coverage_markdown
from ekka_core.report.findings import source_of
from ekka_core.report.graph_section import graph_markdown
from ekka_core.report.serving_section import serving_markdown
from ekka_core.sources import short_path


def render_markdown(report: Report) -> str:
    lines = [f"# Ekka report", "", f"**Verdict:** {headline(report)}", ""]
    if report.suspects:
        lines += ["| rank | module | class | source | error ratio | onset token | finding |",
                  "|---|---|---|---|---|---|---|"]
        for s in report.suspects:
            t = s.target
            call = f" (called at {short_path(t.call_file)}:{t.call_line})" if t.call_file else ""
            lines.append(f"| {s.rank} | `{t.module}` | {t.cls} | {source_of(s)}{call} | "
                         f"{s.error_ratio} | {s.onset_token} | **{s.kind}**: {s.summary} — {s.evidence} |")
        lines.append("")
    lines += serving_markdown(report)
    lines += graph_markdown(report)
    lines += ["", f"Coverage: {coverage_line(report)}."]
    agent = report.agent
    if agent and agent.status != "nothing-to-do":
        lines += ["", "## Mapping agent", "", f"- {agent.status}: {agent.message}",
                  f"- {agent.usage.calls} API calls, ${agent.usage.dollars:.4f}"]
        files = agent.transcript or {}
        if files:
            lines.append(f"- transcript of every request, response and tool call: "
                         f"{files.get('markdown') or files.get('jsonl')}")
    lines += coverage_markdown(report)
    if report.bisect:
        from ekka_core.report.bisect_section import bisect_markdown
        lines += bisect_markdown(report.bisect)
    return "\n".join(lines) + "\n"
