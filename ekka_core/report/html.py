"""report.html, self-contained: the verdict, the suspects, and the two plots (error ratio along the execution
order, layer × position heat map) as inline SVG and a table."""

from __future__ import annotations

import html
import math

from ekka_core.contracts.report import Report, headline
from ekka_core.report.coverage import coverage_html, coverage_line
from ekka_core.report.findings import source_of
from ekka_core.report.graph_section import graph_html
from ekka_core.report.serving_section import serving_html
from ekka_core.sources import short_path


def _color(r: float | None, thr: float) -> str:
    if r is None or (isinstance(r, float) and math.isnan(r)):
        return "#eee"
    x = min(max(math.log10(max(r, 1e-3)) / math.log10(max(thr, 1.01)) / 3, 0.0), 1.0)  # 0 … thr³
    return f"hsl({int(120 - 120 * x)},70%,{int(85 - 35 * x)}%)"


def render_html(report: Report) -> str:
    plots = report.plots
    thr = plots.threshold
    series = plots.series
    ratios = [s.error_ratio if s.error_ratio is not None else 0.0 for s in series]
    w, h, pad = 900, 260, 48
    n = max(len(series), 1)
    ymax = max([math.log10(max(r, 1e-3)) for r in ratios] + [math.log10(thr) + 1])
    ymin = min([math.log10(max(r, 1e-3)) for r in ratios] + [-1])

    def xy(i: int, r: float) -> tuple[float, float]:
        y = math.log10(max(r, 1e-3))
        return pad + i * (w - 2 * pad) / max(n - 1, 1), h - pad - (y - ymin) / (ymax - ymin) * (h - 2 * pad)

    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, r) for i, r in enumerate(ratios)))
    _, ty = xy(0, thr)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{"#c0392b" if r > thr else "#2c7"}">'
                   f'<title>{html.escape(s.component)} ({html.escape(s.cls)}): {r:.3g}</title></circle>'
                   for s, r, (x, y) in ((s, r, xy(i, r)) for i, (s, r) in enumerate(zip(series, ratios))))
    cp = ""
    if plots.change_point is not None:
        cx, _ = xy(plots.change_point, 1)
        name = html.escape(series[plots.change_point].component)
        # keep the label inside the plot: right of the line, or left of it near the right edge
        anchor, tx = ("end", cx - 4) if cx > w / 2 else ("start", cx + 4)
        cp = (f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{pad}" y2="{h - pad}" stroke="#c0392b" stroke-dasharray="4"/>'
              f'<text x="{tx:.1f}" y="{pad + 12}" fill="#c0392b" font-size="12" text-anchor="{anchor}">'
              f'change point: {name}</text>')
    ticks = "".join(f'<text x="{pad - 4}" y="{xy(0, 10 ** k)[1] + 4:.1f}" font-size="11" text-anchor="end">'
                    f'{10 ** k:g}</text>' for k in range(math.floor(ymin), math.ceil(ymax) + 1)
                    if pad <= xy(0, 10 ** k)[1] <= h - pad)
    line_plot = (f'<svg width="{w}" height="{h}" role="img" aria-label="error ratio along execution order">'
                 f'<rect x="{pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" fill="#fafafa" stroke="#ccc"/>'
                 f'<line x1="{pad}" x2="{w - pad}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#e67e22"/>'
                 f'<text x="{w - pad - 90}" y="{ty - 4:.1f}" font-size="11" fill="#e67e22">threshold {thr}</text>'
                 f'<polyline points="{pts}" fill="none" stroke="#888"/>{dots}{cp}{ticks}'
                 f'<text x="{w / 2 - 140}" y="{h - 8}" font-size="12">compared components, in execution order →</text>'
                 f'<text x="10" y="{h / 2 + 60}" font-size="11" transform="rotate(-90 10 {h / 2 + 60})">'
                 f'error ratio (log scale)</text></svg>')
    hm = plots.heatmap
    cell = max(4, min(14, 860 // max(len(hm.positions), 1)))
    # Positions a row-level or non-finite finding names: outlined in every layer, so a few wrong rows stand out
    # even where their colour is close to the noise.
    named = {r.position for s in report.suspects if s.kind in ("rows", "non-finite") for r in s.rows}
    rows = "".join(
        f'<tr><th>{html.escape(layer)}</th>' + "".join(
            f'<td style="background:{_color(r, thr)};width:{cell}px;height:18px'
            f'{";outline:2px solid #c0392b" if pos in named else ""}" title="position {pos}: '
            f'{"—" if r is None else f"{r:.3g}"}{" (named by a finding)" if pos in named else ""}"></td>'
            for pos, r in zip(hm.positions, row)) + "</tr>"
        for layer, row in zip(hm.layers, hm.ratios))
    outlined = f"; outlined: positions {', '.join(map(str, sorted(named)))}, named by a finding" if named else ""
    heat = (f'<table class="heat"><caption>error ratio per decoder layer × token position '
            f'(green ≈ noise, red ≫ threshold{outlined})</caption>{rows}<tr><th></th><td colspan="{len(hm.positions)}">'
            f'positions {hm.positions[0] if hm.positions else ""} … {hm.positions[-1] if hm.positions else ""}'
            f'</td></tr></table>')
    sus = "".join(
        f'<tr><td>{s.rank}</td><td><code>{html.escape(s.target.module)}</code></td>'
        f'<td>{html.escape(s.target.cls)}</td>'
        f'<td><code>{html.escape(source_of(s))}</code>'
        + (f'<br><small>called at <code>{html.escape(short_path(s.target.call_file))}:'
           f'{s.target.call_line}</code></small>' if s.target.call_file else "") + '</td>'
        f'<td>{s.error_ratio}</td><td>{s.onset_token}</td><td><b>{html.escape(s.kind)}</b>: '
        f'{html.escape(s.summary)}<br><small>{html.escape(s.evidence)}</small></td></tr>'
        for s in report.suspects)
    verdict_color = {"divergent": "#c0392b", "consistent": "#27ae60"}.get(report.verdict, "#e67e22")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Ekka report</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} h1{{margin:0 0 8px}}
.verdict{{font-size:20px;padding:10px 14px;border-left:6px solid {verdict_color};background:#f6f6f6}}
table{{border-collapse:collapse}} td,th{{padding:2px 6px;font-size:13px;text-align:left;vertical-align:top}}
.suspects td,.suspects th{{border-bottom:1px solid #ddd}} .heat td{{padding:0}} code{{font-size:12px}}
</style></head><body><h1>Ekka report</h1>
<p class="verdict">{html.escape(headline(report))}</p>
<p class="run">{html.escape(_run_line(report))}<br><small>error ratio = the target's distance from an fp32 reference run divided by
the reference's own low-precision distance from it: ≈ 1 is numerical noise, above {thr} is a departure.</small></p>
<h2>Suspects</h2><table class="suspects"><tr><th>#</th><th>module</th><th>class</th><th>source</th>
<th>error ratio</th><th>onset token</th><th>finding</th></tr>{sus or '<tr><td colspan=7>none</td></tr>'}</table>
<p>Coverage: {html.escape(coverage_line(report))}.</p>
{coverage_html(report)}
{serving_html(report)}
{graph_html(report)}
<h2>Error ratio along the execution order</h2>{line_plot}
<h2>Where and when</h2>{heat}
{_bisect_html(report)}
</body></html>"""


def _run_line(report: Report) -> str:
    """What ran, in one line: model, target and reference engines, dtype, inputs."""
    spec, tgt, ref = report.spec, report.meta.target, report.meta.reference
    model = spec.model if spec else "?"
    prompts = len(spec.prompts) if spec else 0
    new_tokens = spec.max_new_tokens if spec else "?"
    return (f"{model} · target {tgt.framework if tgt else '?'} {tgt.version if tgt else ''} vs reference "
            f"{ref.framework if ref else '?'} {ref.version if ref else ''} "
            f"({(ref.attn_implementation if ref else None) or 'eager'}) · {report.dtype} · {prompts} prompt(s), "
            f"{new_tokens} new tokens")


def _bisect_html(report: Report) -> str:
    """The ``ekka bisect`` section (releases tried, what changed), when the report has one."""
    if not report.bisect:
        return ""
    from ekka_core.report.bisect_section import bisect_html
    return bisect_html(report.bisect)
