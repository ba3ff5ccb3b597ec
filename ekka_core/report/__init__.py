"""Stage 6 — report: ``report.json`` (contract ``ekka.report/1``), ``report.md`` and a self-contained
``report.html`` with the two plots (error ratio along the execution order, layer × position heat map).

Entry point: :func:`write_report`. :func:`plot_data` gives the plots as data for the editor's webview.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

from ekka_core.contracts.ranking import NON_FINITE_RATIO, Ranking
from ekka_core.contracts.report import SCHEMA, headline
from ekka_core.report.serving_section import serving_html, serving_markdown
from ekka_core.sources import short_path

__all__ = ["SCHEMA", "build_report", "headline", "plot_data", "render_html", "render_markdown", "write_report"]


def _ratio(r: float | None, digits: int = 3) -> float | None:
    """Ratios as strict JSON numbers: NaN/inf (an overflowing target) become NON_FINITE_RATIO."""
    if r is None:
        return None
    return round(r, digits) if math.isfinite(r) else NON_FINITE_RATIO


def build_report(ranking: Ranking, *, spec: dict[str, Any], meta: dict[str, Any],
                 serving: dict[str, Any] | None = None) -> dict[str, Any]:
    """``serving``: the configurations the diagnosis ran (served symptom check, traced baseline, triage)."""
    suspects = [_suspect_json(s) for s in ranking.suspects]
    return {
        "schema": SCHEMA, "verdict": ranking.verdict, "suspects": suspects,
        "threshold": ranking.threshold, "dtype": ranking.dtype, "spec": spec, "meta": meta,
        "checked": len(ranking.pairs), "unchecked": ranking.unchecked, "notes": ranking.notes,
        "inputs_differ": ranking.inputs_differ, "plots": plot_data(ranking), "serving": _strict(serving),
        "conventions": [_suspect_json(s) for s in ranking.conventions],
    }


def _suspect_json(s: Any) -> dict[str, Any]:
    """One suspect as report.json holds it. ``kind``: module | glue (the code between two children of
    ``target.module``'s forward, ``target.lines`` of ``target.forward_file``) | convention."""
    return {
        "rank": s.rank, "kind": s.kind,
        "target": {"module": s.module, "class": s.cls, "file": s.file, "line": s.line,
                   "forward_file": s.forward_file, "forward_line": s.forward_line,
                   "call_file": s.call_file, "call_line": s.call_line, "lines": list(s.lines),
                   "between": list(s.between)},
        "reference": {"modules": s.reference_modules},
        # NaN marks an enclosing module that was not itself compared (see analysis._rank)
        "error_ratio": None if math.isnan(s.error_ratio) else _ratio(s.error_ratio),
        "input_ratio": _ratio(s.input_ratio), "same_dtype": _ratio(s.same_dtype),
        "onset_token": s.onset_token, "onset_phase": s.onset_phase, "evidence": s.evidence,
    }


def _strict(value: Any) -> Any:
    """Non-finite floats as NON_FINITE_RATIO, so report.json stays strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE_RATIO
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def plot_data(ranking: Ranking) -> dict[str, Any]:
    series = [{"component": p.component, "class": p.cls, "error_ratio": _ratio(p.error_ratio, 4),
               "input_ratio": _ratio(p.input_ratio, 4), "same_dtype": _ratio(p.same_dtype, 4),
               "input_same_dtype": _ratio(p.input_same_dtype, 4), "order": p.order,
               "entered_after": p.entered_after} for p in ranking.pairs]
    # Heat map: decoder layers (residual stream after each layer) × token position, max over sequences.
    layers = [p for p in ranking.pairs if re.fullmatch(r".*layers\.\d+", p.component)]
    positions = sorted({pos for p in layers for _, pos, _ in p.token_ratios})
    grid = []
    for p in layers:
        row: dict[int, float] = {}
        for _, pos, r in p.token_ratios:
            row[pos] = max(r, row.get(pos, 0.0))
        grid.append([_ratio(row[pos]) if pos in row else None for pos in positions])
    return {"series": series, "change_point": ranking.change_point, "threshold": ranking.threshold,
            "heatmap": {"layers": [p.component for p in layers], "positions": positions, "ratios": grid}}


def write_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(report, indent=1))
    paths["md"].write_text(render_markdown(report))
    paths["html"].write_text(render_html(report))
    return paths


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Ekka report", "", f"**Verdict:** {headline(report)}", ""]
    if report["suspects"]:
        lines += ["| rank | module | class | source | error ratio | onset token | evidence |",
                  "|---|---|---|---|---|---|---|"]
        for s in report["suspects"]:
            t = s["target"]
            call = f" (called at {short_path(t['call_file'])}:{t['call_line']})" if t.get("call_file") else ""
            lines.append(f"| {s['rank']} | `{t['module']}` | {t['class']} | {source_of(s)}{call} | "
                         f"{s['error_ratio']} | {s['onset_token']} | {s['evidence']} |")
        lines.append("")
    lines += serving_markdown(report)
    lines += ["", f"Checked {report['checked']} component pairs."]
    agent = report.get("agent")
    if agent and agent.get("status") != "nothing-to-do":
        usage = agent.get("usage", {})
        lines += ["", "## Mapping agent", "", f"- {agent.get('status')}: {agent.get('message', '')}",
                  f"- {usage.get('calls', 0)} API calls, ${usage.get('dollars', 0):.4f}"]
        files = agent.get("transcript") or {}
        if files:
            lines.append(f"- transcript of every request, response and tool call: "
                         f"{files.get('markdown') or files.get('jsonl')}")
    if report["unchecked"]:
        lines += ["", "## Not checked", ""] + [f"- `{u['module']}`: {u['reason']}" for u in report["unchecked"]]
    if report["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    if report.get("bisect"):
        from ekka_core.report.bisect_section import bisect_markdown
        lines += bisect_markdown(report["bisect"])
    return "\n".join(lines) + "\n"


def source_of(suspect: dict[str, Any]) -> str:
    """Where to look: the class line, or for code between two children the forward's line range."""
    t = suspect["target"]
    if suspect.get("kind") == "glue" and t.get("lines"):
        return f"{short_path(t['forward_file'])}:{t['lines'][0]}–{t['lines'][1]}"
    return f"{short_path(t['file'])}:{t['line']}"


def _color(r: float | None, thr: float) -> str:
    if r is None or (isinstance(r, float) and math.isnan(r)):
        return "#eee"
    x = min(max(math.log10(max(r, 1e-3)) / math.log10(max(thr, 1.01)) / 3, 0.0), 1.0)  # 0 … thr³
    return f"hsl({int(120 - 120 * x)},70%,{int(85 - 35 * x)}%)"


def render_html(report: dict[str, Any]) -> str:
    plots = report["plots"]
    thr = plots["threshold"]
    series = plots["series"]
    w, h, pad = 900, 260, 48
    n = max(len(series), 1)
    ymax = max([math.log10(max(s["error_ratio"], 1e-3)) for s in series] + [math.log10(thr) + 1])
    ymin = min([math.log10(max(s["error_ratio"], 1e-3)) for s in series] + [-1])

    def xy(i: int, r: float) -> tuple[float, float]:
        y = math.log10(max(r, 1e-3))
        return pad + i * (w - 2 * pad) / max(n - 1, 1), h - pad - (y - ymin) / (ymax - ymin) * (h - 2 * pad)

    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, s["error_ratio"]) for i, s in enumerate(series)))
    _, ty = xy(0, thr)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{"#c0392b" if s["error_ratio"] > thr else "#2c7"}">'
                   f'<title>{html.escape(s["component"])} ({s["class"]}): {s["error_ratio"]:.3g}</title></circle>'
                   for s, (x, y) in ((s, xy(i, s["error_ratio"])) for i, s in enumerate(series)))
    cp = ""
    if plots["change_point"] is not None:
        cx, _ = xy(plots["change_point"], 1)
        name = html.escape(series[plots["change_point"]]["component"])
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
    hm = plots["heatmap"]
    cell = max(4, min(14, 860 // max(len(hm["positions"]), 1)))
    rows = "".join(
        f'<tr><th>{html.escape(layer)}</th>' + "".join(
            f'<td style="background:{_color(r, thr)};width:{cell}px;height:18px" title="position {pos}: '
            f'{"—" if r is None else f"{r:.3g}"}"></td>' for pos, r in zip(hm["positions"], row)) + "</tr>"
        for layer, row in zip(hm["layers"], hm["ratios"]))
    heat = (f'<table class="heat"><caption>error ratio per decoder layer × token position '
            f'(green ≈ noise, red ≫ threshold)</caption>{rows}<tr><th></th><td colspan="{len(hm["positions"])}">'
            f'positions {hm["positions"][0] if hm["positions"] else ""} … {hm["positions"][-1] if hm["positions"] else ""}'
            f'</td></tr></table>')
    sus = "".join(
        f'<tr><td>{s["rank"]}</td><td><code>{html.escape(s["target"]["module"])}</code></td>'
        f'<td>{html.escape(s["target"]["class"])}</td>'
        f'<td><code>{html.escape(source_of(s))}</code>'
        + (f'<br><small>called at <code>{html.escape(short_path(s["target"]["call_file"]))}:'
           f'{s["target"]["call_line"]}</code></small>' if s["target"].get("call_file") else "") + '</td>'
        f'<td>{s["error_ratio"]}</td><td>{s["onset_token"]}</td><td>{html.escape(s["evidence"])}</td></tr>'
        for s in report["suspects"])
    unchecked = "".join(f"<li><code>{html.escape(u['module'] or '<root>')}</code>: {html.escape(u['reason'])}</li>"
                        for u in report["unchecked"])
    meta, spec = report.get("meta", {}), report.get("spec", {})
    tgt, ref = meta.get("target", {}), meta.get("reference", {})
    run_line = (f"{spec.get('model', '?')} · target {tgt.get('framework', '?')} {tgt.get('version', '')} vs reference "
                f"{ref.get('framework', '?')} {ref.get('version', '')} ({ref.get('attn_implementation') or 'eager'}) · "
                f"{report.get('dtype', '')} · {len(spec.get('prompts', []))} prompt(s), "
                f"{spec.get('max_new_tokens', '?')} new tokens")
    verdict_color = {"divergent": "#c0392b", "consistent": "#27ae60"}.get(report["verdict"], "#e67e22")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Ekka report</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} h1{{margin:0 0 8px}}
.verdict{{font-size:20px;padding:10px 14px;border-left:6px solid {verdict_color};background:#f6f6f6}}
table{{border-collapse:collapse}} td,th{{padding:2px 6px;font-size:13px;text-align:left;vertical-align:top}}
.suspects td,.suspects th{{border-bottom:1px solid #ddd}} .heat td{{padding:0}} code{{font-size:12px}}
</style></head><body><h1>Ekka report</h1>
<p class="verdict">{html.escape(headline(report))}</p>
<p class="run">{html.escape(run_line)}<br><small>error ratio = the target's distance from an fp32 reference run divided by
the reference's own low-precision distance from it: ≈ 1 is numerical noise, above {thr} is a departure.</small></p>
<h2>Suspects</h2><table class="suspects"><tr><th>#</th><th>module</th><th>class</th><th>source</th>
<th>error ratio</th><th>onset token</th><th>evidence</th></tr>{sus or '<tr><td colspan=7>none</td></tr>'}</table>
{serving_html(report)}
<h2>Error ratio along the execution order</h2>{line_plot}
<h2>Where and when</h2>{heat}
<p>Checked {report["checked"]} component pairs.</p>
<details><summary>{len(report["unchecked"])} not checked</summary><ul>{unchecked}</ul></details>
{_bisect_html(report)}
</body></html>"""


def _bisect_html(report: dict[str, Any]) -> str:
    """The ``ekka bisect`` section (releases tried, what changed), when the report has one."""
    if not report.get("bisect"):
        return ""
    from ekka_core.report.bisect_section import bisect_html
    return bisect_html(report["bisect"])
