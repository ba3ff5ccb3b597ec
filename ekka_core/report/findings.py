"""One rendering per finding kind, used by every surface: the report's Markdown and HTML, the CLI, the language
server's diagnostics and hovers, and — through ``Suspect.summary`` in report.json — the editor's tree view.

A new finding kind adds one function to :data:`RENDERERS`.
"""

from __future__ import annotations

from typing import Callable

from ekka_core.contracts.report import Suspect, SuspectKind, fmt_ratio
from ekka_core.sources import short_path


def _onset(s: Suspect) -> str:
    if s.onset_token is None:
        return ""
    return f", from token {s.onset_token}" + (f" ({s.onset_phase})" if s.onset_phase else "")


def _module(s: Suspect) -> str:
    if s.error_ratio is None:
        return "encloses the divergence (not itself compared)"
    return f"error ratio {fmt_ratio(s.error_ratio)}{_onset(s)}"


def _glue(s: Suspect) -> str:
    between = " and ".join(s.target.between) or "two of its children"
    return f"the code between {between} in its forward: error ratio {fmt_ratio(s.error_ratio)}{_onset(s)}"


def _convention(s: Suspect) -> str:
    return (f"departs from the reference's own rounding ({fmt_ratio(s.same_dtype)}× its rounding error)"
            f"{_onset(s)}")


def _non_finite(s: Suspect) -> str:
    first = s.rows[0] if s.rows else None
    at = f", first at request {first.request} token {first.position}" if first else ""
    return f"{s.non_finite} NaN/Inf output value(s) where the reference is finite{at}"


def _rows(s: Suspect) -> str:
    where = ", ".join(f"request {r.request} token {r.position}" for r in s.rows[:4])
    return f"diverges at {len(s.rows)} row(s) ({where}); pooled error ratio {fmt_ratio(s.error_ratio)}"


def _compiled(s: Suspect) -> str:
    node = next((n for n in s.graph_nodes if n.file), None)
    at = f" at {node.op} ({short_path(node.file)}:{node.line})" if node else ""
    stage = s.compiler_stages[0] if s.compiler_stages else None
    off = f"; agrees with the {stage.stage} {stage.name} off" if stage else "; no single compiler stage turns it off"
    return f"compiled code departs from the same graph run eagerly{at}: error ratio {fmt_ratio(s.error_ratio)}{off}"


RENDERERS: dict[SuspectKind, Callable[[Suspect], str]] = {
    "module": _module, "glue": _glue, "convention": _convention, "non-finite": _non_finite, "rows": _rows,
    "compiled": _compiled,
}


def summary(s: Suspect) -> str:
    """The finding in one line, after its module and class: what is wrong there and from when."""
    return RENDERERS.get(s.kind, _module)(s)


def source_of(s: Suspect) -> str:
    """Where to look: the class line, for code between two children the forward's line range, for compiled code the
    source line of its first departing graph node."""
    t = s.target
    node = next((n for n in s.graph_nodes if n.file and n.line), None)
    if s.kind == "compiled" and node is not None:
        return f"{short_path(node.file)}:{node.line}"
    if s.kind == "glue" and t.lines:
        return f"{short_path(t.forward_file)}:{t.lines[0]}–{t.lines[1]}"
    return f"{short_path(t.file)}:{t.line}"
