"""report.json: the ranking as the report contract holds it (:func:`build_report`, the plots as data:
:func:`plot_data`), and :func:`write_report`, which writes it with its Markdown and HTML renderings."""

from __future__ import annotations

import math
import re
from pathlib import Path

from ekka_core.contracts.graph import GraphLocalisation
from ekka_core.contracts.ranking import NON_FINITE_RATIO, Ranking
from ekka_core.contracts.ranking import Suspect as RankedSuspect
from ekka_core.contracts.report import (AgentSection, CheckRecord, HeatMap, Plots, ReferenceModules, Report, RunMeta,
                                        SeriesPoint, ServingSection, Suspect, TargetLocation)
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.report.findings import summary
from ekka_core.report.html import render_html
from ekka_core.report.markdown import render_markdown


def _ratio(r: float | None, digits: int = 3) -> float | None:
    """Ratios as strict JSON numbers: NaN/inf (an overflowing target) become NON_FINITE_RATIO."""
    if r is None:
        return None
    return round(r, digits) if math.isfinite(r) else NON_FINITE_RATIO


def build_report(ranking: Ranking, *, spec: DiagnosisSpec, meta: RunMeta, serving: ServingSection | None = None,
                 agent: AgentSection | None = None, missing: list[str] | None = None,
                 checks: list[CheckRecord] | None = None, graph: GraphLocalisation | None = None) -> Report:
    """``serving``: the configurations the diagnosis ran (served symptom check, traced baseline, triage);
    ``graph``: the in-graph localisation of a compile-only difference (its per-piece ratios are plotted)."""
    return Report(
        verdict=ranking.verdict, suspects=[report_suspect(s) for s in ranking.suspects],
        threshold=ranking.threshold, dtype=ranking.dtype, spec=spec, meta=meta, checked=len(ranking.pairs),
        unchecked=list(ranking.unchecked), notes=list(ranking.notes), inputs_differ=list(ranking.inputs_differ),
        plots=plot_data(ranking), serving=serving, conventions=[report_suspect(s) for s in ranking.conventions],
        missing=list(missing or []), checks=list(checks or []), agent=agent, graph=graph)


def report_suspect(s: RankedSuspect) -> Suspect:
    """One ranked suspect as report.json holds it. ``kind``: module | glue (the code between two children of
    ``target.module``'s forward, ``target.lines`` of ``target.forward_file``) | convention | non-finite | rows |
    compiled (``graph_nodes``, ``compiler_stages``)."""
    suspect = Suspect(
        rank=s.rank, kind=s.kind,
        target=TargetLocation(module=s.module, cls=s.cls, file=s.file, line=s.line, forward_file=s.forward_file,
                              forward_line=s.forward_line, call_file=s.call_file, call_line=s.call_line,
                              lines=list(s.lines), between=list(s.between)),
        reference=ReferenceModules(list(s.reference_modules)),
        # NaN marks an enclosing module that was not itself compared (see analysis._rank)
        error_ratio=None if math.isnan(s.error_ratio) else _ratio(s.error_ratio),
        input_ratio=_ratio(s.input_ratio), same_dtype=_ratio(s.same_dtype),
        onset_token=s.onset_token, onset_phase=s.onset_phase, evidence=s.evidence,
        rows=list(s.rows), non_finite=s.non_finite, graph_nodes=list(s.graph_nodes),
        compiler_stages=list(s.compiler_stages))
    suspect.summary = summary(suspect)
    return suspect


def plot_data(ranking: Ranking) -> Plots:
    series = [SeriesPoint(component=p.component, cls=p.cls, error_ratio=_ratio(p.error_ratio, 4),
                          input_ratio=_ratio(p.input_ratio, 4), same_dtype=_ratio(p.same_dtype, 4),
                          input_same_dtype=_ratio(p.input_same_dtype, 4), order=p.order,
                          entered_after=p.entered_after) for p in ranking.pairs]
    # Heat map: decoder layers (residual stream after each layer) × token position, max over sequences.
    layers = [p for p in ranking.pairs if re.fullmatch(r".*layers\.\d+", p.component)]
    positions = sorted({pos for p in layers for _, pos, _ in p.token_ratios})
    grid = []
    for p in layers:
        row: dict[int, float] = {}
        for _, pos, r in p.token_ratios:
            row[pos] = max(r, row.get(pos, 0.0))
        grid.append([_ratio(row[pos]) if pos in row else None for pos in positions])
    return Plots(series=series, change_point=ranking.change_point, threshold=ranking.threshold,
                 heatmap=HeatMap(layers=[p.component for p in layers], positions=positions, ratios=grid))


def write_report(report: Report, out_dir: Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    report.save(paths["json"])
    paths["md"].write_text(render_markdown(report))
    paths["html"].write_text(render_html(report))
    return paths
