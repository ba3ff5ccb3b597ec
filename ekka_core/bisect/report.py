"""The CLI's view of a bisection: the releases tried (a rich table), the outcome, then the diff."""

from __future__ import annotations

from pathlib import Path

from ekka_core.contracts.report import Report


def print_bisect(report: Report, paths: dict[str, Path]) -> None:
    from rich.console import Console
    from rich.syntax import Syntax
    from rich.table import Table

    from ekka_core.report.bisect_section import environment, headline, traces
    from ekka_core.sources import short_path

    b = report.bisect
    if b is None:
        raise ValueError("the report has no bisect section")
    out = Console(width=max(Console().width, 140))
    t = Table(title="Releases diagnosed (in the order tried)")
    for col in ("release", "verdict", "rank-1 suspect", "s", "environment", "traces"):
        t.add_column(col, overflow="fold")
    colour = {"consistent": "green", "divergent": "red"}
    for r in b.tried:
        t.add_row(r.label, f"[{colour.get(r.verdict, 'yellow')}]{r.verdict}[/]", r.top_suspect or "—",
                  f"{r.seconds:.0f}", environment(r), traces(r))
    out.print(t)
    style = "bold red" if b.outcome != "no-regression" else "bold green"
    out.print(f"[{style}]{headline(b)}[/]")
    s = b.suspect
    if s:
        out.print(f"rank-1 suspect at {b.first_bad}: {s.module} ({s.cls}, {short_path(s.file or '')}:{s.line})")
    if b.note:
        out.print(b.note)
    for c in b.changes:
        out.print(f"\n[bold]{c.symbol}[/] ({c.kind}, {c.status})")
        out.print(Syntax(c.unified_diff, "diff", theme="ansi_dark", word_wrap=True))
    if b.custom_ops:
        out.print("compiled custom ops reached (no Python source): " + ", ".join(b.custom_ops))
    out.print(f"report: {paths['json']}  {paths['html']}")
