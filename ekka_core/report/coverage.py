"""What the diagnosis looked at and what it did not, as every surface shows it: the CLI summary, report.md,
report.html and the editor (the language server's hover, the Silent errors view's "Not checked" node).

A verdict is only as good as what was observed. So wherever the verdict is shown, so are: what could not be observed
(an ``inconclusive`` verdict's reasons, each with its fix), each check and what it found, departures from the
reference's rounding that did not decide the verdict, the components that were not compared and why, and the notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ekka_core.contracts.report import Report
from ekka_core.report.findings import summary

STATUS_MARK = {"agrees": "✓", "diverges": "✗", "inconclusive": "?", "skipped": "–"}


@dataclass
class CoverageSection:
    key: str                      # missing | checks | conventions | unchecked | notes
    title: str
    items: list[tuple[str, str]] = field(default_factory=list)     # (label, text); label may be ""


def coverage(report: Report) -> list[CoverageSection]:
    """The sections that have something to say, in the order a reader needs them."""
    sections = [
        CoverageSection("missing", "Not observed", [("", m) for m in report.missing]),
        CoverageSection("checks", "Checks", [(f"{STATUS_MARK.get(c.status, '')} {c.check}",
                                              f"{c.status}" + (f" — {c.words}" if c.words else ""))
                                             for c in report.checks]),
        CoverageSection("conventions", "Departures from the reference's rounding",
                        [(c.target.module, summary(c)) for c in report.conventions
                         if report.verdict != "divergent" or c not in report.suspects]),
        CoverageSection("unchecked", f"Not checked ({len(report.unchecked)})",
                        [(u.module or "<root>", u.reason) for u in report.unchecked]),
        CoverageSection("notes", "Notes", [("", n) for n in report.notes]),
    ]
    return [s for s in sections if s.items]


def coverage_line(report: Report) -> str:
    """How much was compared, in a few words (the headline's companion)."""
    parts = [f"{report.checked} component pairs compared"]
    if report.unchecked:
        parts.append(f"{len(report.unchecked)} not checked")
    inconclusive = [c.check for c in report.checks if c.status == "inconclusive"]
    if inconclusive:
        parts.append("could not observe: " + ", ".join(inconclusive))
    return "; ".join(parts)


def coverage_markdown(report: Report) -> list[str]:
    lines: list[str] = []
    for s in coverage(report):
        lines += ["", f"## {s.title}", ""]
        lines += [f"- {_md_label(s.key, label)}{text}" for label, text in s.items]
    return lines


def _md_label(key: str, label: str) -> str:
    if not label:
        return ""
    return f"`{label}`: " if key in ("unchecked", "conventions") else f"{label}: "


def coverage_html(report: Report) -> str:
    import html

    out = []
    for s in coverage(report):
        items = "".join(f"<li>{f'<code>{html.escape(label)}</code>: ' if label else ''}{html.escape(text)}</li>"
                        for label, text in s.items)
        if s.key == "unchecked" and len(s.items) > 8:      # long lists fold; what is missing never does
            out.append(f'<details class="coverage {s.key}"><summary>{html.escape(s.title)}</summary><ul>{items}</ul>'
                       f"</details>")
        else:
            out.append(f'<section class="coverage {s.key}"><h2>{html.escape(s.title)}</h2><ul>{items}</ul></section>')
    return "\n".join(out)


def coverage_console(report: Report, *, most: int = 5) -> list[str]:
    """For the CLI summary (rich markup): every section, long ones cut to ``most`` items with the count left."""
    lines = []
    for s in coverage(report):
        style = "bold yellow" if s.key == "missing" else "bold"
        lines.append(f"[{style}]{s.title}[/]")
        shown = s.items if s.key in ("missing", "checks") else s.items[:most]
        lines += [f"  {label + ': ' if label else ''}{text}" for label, text in shown]
        if len(shown) < len(s.items):
            lines.append(f"  … and {len(s.items) - len(shown)} more (report.md)")
    return lines
