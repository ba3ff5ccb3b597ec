"""The in-graph localisation's section of report.md and report.html: the compiled-vs-eager ratio of every piece of
the engine's compiled graph, plotted along the graph (a bar per piece, in graph order, log scale, the limit drawn),
then the suspect's graph nodes with their source lines and the compiler stages tried."""

from __future__ import annotations

import html
import math

from ekka_core.contracts.graph import GraphLocalisation, PieceResult
from ekka_core.contracts.report import Report, fmt_ratio
from ekka_core.sources import short_path


def _plotted(g: GraphLocalisation) -> list[PieceResult]:
    """The graph's pieces in graph order, then the suspect layer's children (the second level of the split)."""
    return [*g.pieces, *g.inner_pieces]


def _state(p: PieceResult) -> str:
    if p.departs:
        return "departs"
    if p.error_ratio is None:
        return "compared child by child" if p.covered_by_children else "not compared"
    return "agrees"


def graph_markdown(report: Report) -> list[str]:
    g = report.graph
    if g is None:
        return []
    lines = ["", "## Inside the compiled graph", ""]
    if not g.replayable:
        lines.append(f"The compiled graph could not be localised: {g.reason}")
        return lines
    lines.append(f"Compiled vs eager on the engine's own graph and first-step inputs (limit {fmt_ratio(g.threshold)}, "
                 f"per token row {fmt_ratio(g.row_threshold)}; {g.dtype}, fp32 twin as the truth).")
    lines += ["", "| piece | module | class | nodes | ratio | worst row | state |", "|---|---|---|---|---|---|---|"]
    for p in _plotted(g):
        why = f" ({p.not_compared})" if p.not_compared and not p.covered_by_children else ""
        lines.append(f"| {p.index} | `{p.module}` | {p.module_class or ''} | {p.nodes} | {fmt_ratio(p.error_ratio)} | "
                     f"{fmt_ratio(p.worst_row_ratio)} | {_state(p)}{why} |")
    if g.suspect_nodes:
        lines += ["", f"Graph nodes of `{g.suspect.module if g.suspect else ''}` ({g.node_words}):", ""]
        lines += [f"- `{n.node}` ({n.op}) at {short_path(n.file)}:{n.line} `{n.code or ''}`" for n in g.suspect_nodes]
    if g.passes:
        lines += ["", "Compiler stages whose removal brings it back within noise:", ""]
        lines += [f"- {f.stage} `{f.name}`: {f.words}" for f in g.passes]
    elif g.departs:
        lines += ["", "No single compiler stage tried turns it off: " + "; ".join(g.tried_toggles)]
    lines += [f"- note: {n}" for n in g.notes]
    return lines


def graph_html(report: Report) -> str:
    g = report.graph
    if g is None:
        return ""
    if not g.replayable:
        return (f"<h2>Inside the compiled graph</h2><p>The compiled graph could not be localised: "
                f"{html.escape(g.reason)}</p>")
    nodes = "".join(f"<li><code>{html.escape(n.node)}</code> ({html.escape(n.op)}) at "
                    f"<code>{html.escape(short_path(n.file))}:{n.line}</code> <code>{html.escape(n.code or '')}</code>"
                    f"</li>" for n in g.suspect_nodes)
    stages = "".join(f"<li>{html.escape(f.stage)} <code>{html.escape(f.name)}</code>: {html.escape(f.words)}</li>"
                     for f in g.passes)
    suspect = html.escape(g.suspect.module) if g.suspect else ""
    return (f"<h2>Inside the compiled graph</h2>{_bars(g)}"
            + (f"<p>Graph nodes of <code>{suspect}</code> ({html.escape(g.node_words)}):</p><ul>{nodes}</ul>"
               if nodes else "")
            + (f"<p>Compiler stages whose removal brings it back within noise:</p><ul>{stages}</ul>" if stages else "")
            + "".join(f"<p><small>{html.escape(n)}</small></p>" for n in g.notes))


def _bars(g: GraphLocalisation) -> str:
    """One bar per piece along the graph: its compiled-vs-eager ratio on a log scale, the limit as a line; a piece
    not compared is a grey stub (labelled), never a bar of zero that would read as agreement."""
    pieces = _plotted(g)
    w, h, pad = 900, 260, 48
    n = max(len(pieces), 1)
    ratios = [p.error_ratio for p in pieces]
    logs = [math.log10(max(r, 1e-3)) for r in ratios if r is not None and math.isfinite(r)]
    ymax = max(logs + [math.log10(max(g.threshold, 1.01)) + 1])
    ymin = min(logs + [-1.0])
    step = (w - 2 * pad) / n

    def y(r: float) -> float:
        return h - pad - (math.log10(max(r, 1e-3)) - ymin) / (ymax - ymin) * (h - 2 * pad)

    bars = []
    for i, (p, r) in enumerate(zip(pieces, ratios)):
        x = pad + i * step + step * 0.15
        bw = step * 0.7
        tip = f"{p.module} ({p.module_class or ''}): {fmt_ratio(r)} — {_state(p)}"
        if r is None:
            bars.append(f'<rect x="{x:.1f}" y="{h - pad - 6}" width="{bw:.1f}" height="6" fill="#bbb">'
                        f'<title>{html.escape(tip)}</title></rect>')
            continue
        colour = "#c0392b" if p.departs else "#2c7"
        top = y(r)
        bars.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{bw:.1f}" height="{h - pad - top:.1f}" fill="{colour}">'
                    f'<title>{html.escape(tip)}</title></rect>')
    limit = y(g.threshold)
    labels = "".join(f'<text x="{pad + (i + 0.5) * step:.1f}" y="{h - pad + 12}" font-size="9" text-anchor="end" '
                     f'transform="rotate(-35 {pad + (i + 0.5) * step:.1f} {h - pad + 12})">'
                     f'{html.escape(".".join(p.module.split(".")[-2:]))}'
                     f'</text>' for i, p in enumerate(pieces)) if n <= 40 else ""
    return (f'<svg width="{w}" height="{h + 40}" role="img" aria-label="compiled vs eager ratio per piece of the graph">'
            f'<rect x="{pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" fill="#fafafa" stroke="#ccc"/>'
            f'{"".join(bars)}'
            f'<line x1="{pad}" x2="{w - pad}" y1="{limit:.1f}" y2="{limit:.1f}" stroke="#e67e22"/>'
            f'<text x="{w - pad - 150}" y="{limit - 4:.1f}" font-size="11" fill="#e67e22">limit {fmt_ratio(g.threshold)}'
            f' (clean compiled noise)</text>{labels}'
            f'<text x="10" y="{h / 2 + 60}" font-size="11" transform="rotate(-90 10 {h / 2 + 60})">'
            f'compiled vs eager ratio (log)</text>'
            f'<text x="{w / 2 - 160}" y="{pad - 10}" font-size="12">pieces of the compiled graph, in graph order →'
            f'</text></svg>')
