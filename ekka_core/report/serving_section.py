"""The report's sections on what ran: the served configuration's symptom check, the traced configuration and every
change made to it, configuration triage, the inputs pre-flight, and departures from the reference's rounding.

Markdown lines and HTML fragments from the report's ``serving``, ``inputs_differ`` and ``conventions``; the
per-position symptom ratios are drawn as a plot, not only listed.
"""

from __future__ import annotations

import html
import math
from typing import Any

from ekka_core.contracts.report import Report, ServingSection, fmt_ratio
from ekka_core.contracts.serving import FACTORS, SymptomCheck, Trial, Triage
from ekka_core.sources import short_path


def _check_words(check: SymptomCheck | None) -> str:
    if not check:
        return "not run"
    state = "**diverges**" if check.diverges else "matches the reference"
    first = check.first
    where = f", first at request {first.request} token {first.position}" if first else ""
    cached = f"; {check.cached_tokens} prompt tokens from the prefix cache" if check.cached_tokens else ""
    # The note says how the noise floor was taken where MoE routing ties changed it: said out loud, not hidden.
    note = f" — {check.note}" if check.note else ""
    return f"{state} at the logits level (ratio {fmt_ratio(check.ratio)}{where}{cached}){note}"


def _args(args: dict[str, Any] | None) -> str:
    if not args:
        return "vLLM's defaults"
    return ", ".join(f"{k}={v!r}" for k, v in args.items() if k not in ("model", "seed")) or "vLLM's defaults"


def _trial_name(t: Trial) -> str:
    return "baseline + " + (", ".join(t.factors) or "nothing")


def _trial_outcome(t: Trial) -> str:
    return t.error if t.error else ("yes" if t.diverges else "no")


def _trial_graph(t: Trial) -> str:
    return {"loaded": "loaded from the compile cache", "compiled": "compiled"}.get(t.compiled_graph, "—")


def _ruled_out_words(triage: Triage, factor: str, why: str) -> str:
    kept = ("; every trial keeps its served value (the same computation for these requests, and part of vLLM's "
            "compile cache key)") if factor in triage.kept_as_served else ""
    return f"{FACTORS.get(factor, factor)}: ruled out — {why}{kept}"


def _compile_cache_words(resolved: dict) -> str:
    use = resolved.get("compile_cache")
    return {"loaded": ", its compiled graph loaded from vLLM's compile cache",
            "compiled": ", its graph compiled in this run"}.get(use, "")


def serving_markdown(report: Report) -> list[str]:
    serving = report.serving
    lines: list[str] = []
    if serving:
        # served_resolved is what the engine resolved its configuration to: an open table of engine settings
        resolved = serving.served_resolved or {}
        lines += ["## What ran", "",
                  f"- **Served configuration** ({_args(serving.served_args)}; the engine resolved: compile mode "
                  f"{resolved.get('compilation_mode')}, custom ops {resolved.get('custom_ops')}, prefix caching "
                  f"{resolved.get('enable_prefix_caching')}, chunk budget {resolved.get('max_num_batched_tokens')}, "
                  f"up to {resolved.get('max_num_seqs')} requests per step{_compile_cache_words(resolved)}): "
                  f"{_check_words(serving.served)}",
                  f"- **Traced configuration**: {_check_words(serving.traced)}"]
        for c in serving.changes:
            lines.append(f"  - `{c.arg}` = `{c.traced!r}` (served: `{c.served!r}`) — {c.why}")
        triage = serving.triage
        if triage:
            lines += ["", "### Configuration triage", "", f"{triage.words or triage.direction}", ""]
            if triage.differing:
                lines.append("Served features that differ from the traced baseline: " + ", ".join(
                    f"{FACTORS.get(f, f)} ({v.baseline!r} → {v.served!r})" for f, v in triage.differing.items()))
            for f, why in triage.ruled_out.items():
                lines.append(f"- {_ruled_out_words(triage, f, why)}")
            if triage.trials:
                lines += ["", "| configuration tried | logits-level ratio | diverges | s | compiled graph |",
                          "|---|---|---|---|---|"]
                for t in triage.trials:
                    lines.append(f"| {_trial_name(t)} | {fmt_ratio(t.ratio)} | {_trial_outcome(t)} | "
                                 f"{t.seconds:.0f} | {_trial_graph(t)} |")
            if triage.culprit:
                lines.append("")
                lines.append(f"Culprit: {', '.join(triage.culprit)}"
                             + (f"; traced again with {', '.join(triage.traced_under)} as served"
                                if triage.traced_under else ""))
        lines.append("")
    for d in report.inputs_differ:
        start = d.window_start
        lines += [f"- request {d.request!r} ({d.input or 'prompt'}): the ids fed by "
                  f"{d.fed_from or 'the engine'} differ from the reference's own rendering at token "
                  f"{d.position} (lengths {d.target_len or len(d.target)} vs "
                  f"{d.reference_len or len(d.reference)})",
                  f"  - engine:    `{d.target}` — tokens from {start}: {d.target_tokens}",
                  f"  - reference: `{d.reference}` — tokens from {start}: {d.reference_tokens}"]
    if report.conventions:
        lines += ["", "## Departures from the reference's rounding", ""]
        for c in report.conventions:
            lines.append(f"- `{c.target.module}` ({c.target.cls}, "
                         f"{short_path(c.target.file)}:{c.target.line}): {c.evidence}")
    return lines


def serving_html(report: Report) -> str:
    serving = report.serving
    parts: list[str] = []
    if serving:
        parts.append("<h2>What ran</h2><ul>")
        parts.append(f"<li><b>Served configuration</b> ({html.escape(_args(serving.served_args))}): "
                     f"{html.escape(_check_words(serving.served).replace('**', ''))}</li>")
        parts.append(f"<li><b>Traced configuration</b>: "
                     f"{html.escape(_check_words(serving.traced).replace('**', ''))}<ul>")
        for c in serving.changes:
            parts.append(f"<li><code>{html.escape(c.arg)}={html.escape(repr(c.traced))}</code> (served "
                         f"{html.escape(repr(c.served))}) — {html.escape(c.why)}</li>")
        parts.append("</ul></li></ul>")
        parts.append(_symptom_plot(serving))
        triage = serving.triage
        if triage:
            parts.append(f"<h3>Configuration triage</h3><p>{html.escape(triage.words)}</p>")
            if triage.ruled_out:
                parts.append("<ul>" + "".join(f"<li>{html.escape(_ruled_out_words(triage, f, why))}</li>"
                                              for f, why in triage.ruled_out.items()) + "</ul>")
            if triage.trials:
                rows = "".join(
                    f"<tr><td>{html.escape(_trial_name(t))}</td><td>{fmt_ratio(t.ratio)}</td>"
                    f"<td>{html.escape(_trial_outcome(t))}</td><td>{t.seconds:.0f}</td>"
                    f"<td>{html.escape(_trial_graph(t))}</td></tr>" for t in triage.trials)
                parts.append("<table class='suspects'><tr><th>configuration</th><th>logits-level ratio</th>"
                             f"<th>diverges</th><th>s</th><th>compiled graph</th></tr>{rows}</table>")
    for d in report.inputs_differ:
        parts.append(f"<p>Request {html.escape(str(d.request))}: ids differ from token "
                     f"{d.position}.<br>engine: <code>{html.escape(str(d.target_tokens))}</code><br>"
                     f"reference: <code>{html.escape(str(d.reference_tokens))}</code></p>")
    if report.conventions:
        parts.append("<h2>Departures from the reference's rounding</h2><ul>" + "".join(
            f"<li><code>{html.escape(c.target.module)}</code>: {html.escape(c.evidence)}</li>"
            for c in report.conventions) + "</ul>")
    return "".join(parts)


def _symptom_plot(serving: ServingSection) -> str:
    """Logits-level ratio per sampled position, served (red) and traced (blue), log scale, threshold line."""
    series = [(name, colour, check.positions if check else [])
              for name, colour, check in (("served", "#c0392b", serving.served), ("traced", "#2980b9", serving.traced))]
    n = max((len(p) for _, _, p in series), default=0)
    if n == 0:
        return ""
    either = serving.served or serving.traced
    thr = either.threshold if either else 2.0
    w, h, pad = 900, 180, 40
    values = [max(p.ratio, 1e-3) for _, _, ps in series for p in ps] + [thr * 10, 0.1]
    lo, hi = math.log10(min(values)), math.log10(max(values))

    def xy(i: int, r: float) -> tuple[float, float]:
        return (pad + i * (w - 2 * pad) / max(n - 1, 1),
                h - pad - (math.log10(max(r, 1e-3)) - lo) / max(hi - lo, 1e-9) * (h - 2 * pad))

    lines = []
    for name, colour, ps in series:
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, p.ratio) for i, p in enumerate(ps)))
        lines.append(f'<polyline points="{pts}" fill="none" stroke="{colour}"/>'
                     f'<text x="{w - pad - 60}" y="{pad + (14 if name == "served" else 28)}" font-size="11" '
                     f'fill="{colour}">{name}</text>')
    _, ty = xy(0, thr)
    return (f'<svg width="{w}" height="{h}" role="img" aria-label="logits-level ratio per sampled position">'
            f'<rect x="{pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" fill="#fafafa" stroke="#ccc"/>'
            f'<line x1="{pad}" x2="{w - pad}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#e67e22"/>{"".join(lines)}'
            f'<text x="{w / 2 - 150}" y="{h - 8}" font-size="12">sampled positions (request by request) →</text>'
            f'</svg>')
