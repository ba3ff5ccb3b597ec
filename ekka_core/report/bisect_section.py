"""The report's ``bisect`` section as Markdown and HTML: the releases tried with their verdicts, the last good and
first bad release, and the unified diff of what changed for the suspect (rendered line by line, coloured)."""

from __future__ import annotations

import html

from ekka_core.contracts.report import BisectSection, BisectTried
from ekka_core.sources import short_path


def headline(b: BisectSection) -> str:
    if b.outcome == "regression-found":
        return f"last good {b.last_good} · first bad {b.first_bad}"
    if b.outcome == "bad-from-start":
        return f"already bad at the oldest release tried ({b.first_bad})"
    return f"no regression: every release tried is consistent (newest: {b.last_good})"


def environment(t: BisectTried) -> str:
    """How the release's environment came to be: reused, or built (and how long that took)."""
    return "reused" if t.env_reused else f"built ({t.env_seconds:.0f} s)"


def traces(t: BisectTried) -> str:
    return "reused" if t.traces_reused else "captured"


def bisect_markdown(b: BisectSection) -> list[str]:
    lines = ["", "## Bisection", "", f"**{headline(b)}** ({len(b.tried)} of {len(b.candidates)} releases "
             f"diagnosed, {b.seconds:.0f} s)", "",
             "| release | verdict | rank-1 suspect | s | environment | traces |", "|---|---|---|---|---|---|"]
    for t in b.tried:
        lines.append(f"| {t.label} | {t.verdict} | `{t.top_suspect or '—'}` | {t.seconds:.0f} | {environment(t)} | "
                     f"{traces(t)} |")
    if b.note:
        lines += ["", b.note]
    if b.changes:
        s = b.suspect
        lines += ["", f"### What changed for `{s.cls if s else None}` ({s.module if s else None}) between "
                      f"{b.last_good} and {b.first_bad}", ""]
        for c in b.changes:
            lines += [f"`{c.symbol}` ({c.kind}, {c.status})", "", "```diff", c.unified_diff.rstrip("\n"), "```", ""]
    if b.custom_ops:
        lines += ["", "Compiled custom ops reached (no Python source to diff): "
                  + ", ".join(f"`{o}`" for o in b.custom_ops)]
    return lines


def _diff_html(diff: str) -> str:
    rows = []
    for line in diff.splitlines():
        cls = ("add" if line.startswith("+") and not line.startswith("+++") else
               "del" if line.startswith("-") and not line.startswith("---") else
               "hunk" if line.startswith("@@") else "file" if line.startswith(("+++", "---")) else "ctx")
        rows.append(f'<span class="d-{cls}">{html.escape(line)}</span>')
    return '<pre class="diff">' + "\n".join(rows) + "</pre>"


def bisect_html(b: BisectSection) -> str:
    def row(t: BisectTried) -> str:
        return (f'<tr><td>{html.escape(t.label)}</td><td class="v-{html.escape(t.verdict)}">'
                f'{html.escape(t.verdict)}</td><td><code>{html.escape(t.top_suspect or "—")}</code></td>'
                f'<td>{t.seconds:.0f}</td><td>{environment(t)}</td><td>{traces(t)}</td></tr>')

    tried = "".join(row(t) for t in b.tried)
    parts = [f'<h2 id="bisect">Bisection</h2><p class="bisect-head"><b>{html.escape(headline(b))}</b> '
             f'({len(b.tried)} of {len(b.candidates)} releases diagnosed)</p>'
             f'<table class="suspects"><tr><th>release</th><th>verdict</th><th>rank-1 suspect</th><th>s</th>'
             f'<th>environment</th><th>traces</th></tr>{tried}</table>']
    if b.note:
        parts.append(f"<p>{html.escape(b.note)}</p>")
    if b.changes:
        parts.append(f"<h3>What changed for <code>{html.escape(str(b.suspect.cls if b.suspect else None))}</code> "
                     f"between {html.escape(str(b.last_good))} and {html.escape(str(b.first_bad))}</h3>")
        for c in b.changes:
            where = short_path(c.file_bad or c.file_good or "")
            parts.append(f'<h4><code>{html.escape(c.symbol)}</code> <small>{html.escape(c.kind)}, '
                         f'{html.escape(c.status)} · {html.escape(where)}</small></h4>{_diff_html(c.unified_diff)}')
    if b.custom_ops:
        parts.append("<p>Compiled custom ops reached (no Python source to diff): "
                     + ", ".join(f"<code>{html.escape(o)}</code>" for o in b.custom_ops) + "</p>")
    style = ("<style>.diff{background:#f8f8f8;padding:8px;font-size:12px;overflow-x:auto}.d-add{color:#1a7f37;"
             "background:#e6ffec;display:block}.d-del{color:#cf222e;background:#ffebe9;display:block}"
             ".d-hunk{color:#8250df;display:block}.d-file{font-weight:bold;display:block}.d-ctx{display:block}"
             ".v-consistent{color:#27ae60}.v-divergent{color:#c0392b}</style>")
    return style + "".join(parts)
