// The divergence plots as inline SVG, and the webview page around them. Pure: no 'vscode' import, no CDN, no
// chart library. Colours come from the VS Code theme through CSS classes (a nonce'd <style>); the heat map's
// per-cell colours are SVG presentation attributes, which a strict CSP (no 'unsafe-inline') allows.
import { formatLocation, formatRatio, suspectName } from "./format";
import type { GraphLocalisation, HeatMap, PieceResult, Plots, Report } from "./protocol";

export interface Box {
  width: number;
  height: number;
  left: number;
  right: number;
  top: number;
  bottom: number;
}

export const SERIES_BOX: Box = { width: 760, height: 300, left: 56, right: 16, top: 26, bottom: 44 };
/** The compiled-graph bar plot: room below for the pieces' rotated module names. */
export const GRAPH_BOX: Box = { width: 760, height: 320, left: 56, right: 16, top: 26, bottom: 96 };

/** Smallest ratio drawn (log scale: ratios ≤ 0 cannot be placed). */
export const MIN_RATIO = 1e-3;
/** The report's stand-in for NaN/inf ratios is huge; the axis stops here and such points sit on its top. */
export const MAX_RATIO = 1e12;

export function escapeXml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

function num(v: number): string {
  // Short, stable numbers in the markup (tests parse them back).
  return String(Math.round(v * 100) / 100);
}

function usable(r: number | null | undefined): r is number {
  return typeof r === "number" && Number.isFinite(r) && r > 0;
}

function clampRatio(r: number): number {
  return Math.min(MAX_RATIO, Math.max(MIN_RATIO, r));
}

/** A log10 axis over whole decades covering every value and 1 (the noise level) and the threshold. */
export interface LogScale {
  /** Lowest and highest decade exponents (the axis spans 10^lo .. 10^hi). */
  lo: number;
  hi: number;
  /** Pixel y of a ratio. */
  y(ratio: number): number;
  /** Decade ticks: ratio and pixel y. */
  ticks: { ratio: number; y: number }[];
}

export function logScale(values: (number | null)[], threshold: number | undefined, top: number, bottom: number): LogScale {
  const logs = values.filter(usable).map((v) => Math.log10(clampRatio(v)));
  logs.push(0);
  if (usable(threshold)) logs.push(Math.log10(threshold));
  let lo = Math.floor(Math.min(...logs));
  let hi = Math.ceil(Math.max(...logs));
  if (hi === lo) hi = lo + 1;
  const y = (ratio: number) => bottom - ((Math.log10(clampRatio(ratio)) - lo) / (hi - lo)) * (bottom - top);
  const ticks = [];
  for (let k = lo; k <= hi; k++) ticks.push({ ratio: 10 ** k, y: y(10 ** k) });
  return { lo, hi, y, ticks };
}

/** Pixel x of the i-th of n points spread over [left, right]. */
export function seriesX(i: number, n: number, left: number, right: number): number {
  if (n <= 1) return (left + right) / 2;
  return left + (i / (n - 1)) * (right - left);
}

function tickLabel(ratio: number): string {
  if (ratio >= 1 && ratio < 1e4) return String(Math.round(ratio));
  if (ratio < 1 && ratio >= 1e-3) return String(Number(ratio.toPrecision(1)));
  return `1e${Math.round(Math.log10(ratio))}`;
}

interface FrameLabels {
  cls: string;
  id: string;
  aria: string;
  yLabel: string;
  xLabel: string;
  xLabelDrop: number;     // the x-axis label's distance above the bottom edge
}

/** The opening <svg>, the log-scale grid and axes and both axis labels of a plot of ratios in `box`; the caller
 * draws the data into `parts` with `scale` and closes the <svg>. */
function logPlotFrame(box: Box, values: (number | null)[], threshold: number | undefined, labels: FrameLabels) {
  const { width, height, left, right, top, bottom } = box;
  const x0 = left;
  const x1 = width - right;
  const yBottom = height - bottom;
  const scale = logScale(values, threshold, top, yBottom);
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" class="plot ${labels.cls}" id="${labels.id}" data-width="${width}" ` +
      `viewBox="0 0 ${width} ${height}" role="img" aria-label="${labels.aria}">`,
    ...logAxes(scale, x0, x1, top, yBottom, labels.yLabel),
    `<text class="axis-label" x="${num((x0 + x1) / 2)}" y="${num(height - labels.xLabelDrop)}" text-anchor="middle">` +
      `${labels.xLabel}</text>`,
  ];
  return { parts, scale, x0, x1, top, yBottom, width, height };
}

/** The decade grid with its tick labels, the two axes and the rotated y-axis label of a log-scale plot. */
function logAxes(scale: LogScale, x0: number, x1: number, top: number, yBottom: number, label: string): string[] {
  const parts: string[] = [];
  for (const t of scale.ticks) {
    parts.push(`<line class="grid" x1="${num(x0)}" x2="${num(x1)}" y1="${num(t.y)}" y2="${num(t.y)}"/>`);
    parts.push(`<text class="tick" x="${num(x0 - 6)}" y="${num(t.y + 4)}" text-anchor="end">${tickLabel(t.ratio)}</text>`);
  }
  parts.push(`<line class="axis" x1="${num(x0)}" x2="${num(x0)}" y1="${num(top)}" y2="${num(yBottom)}"/>`);
  parts.push(`<line class="axis" x1="${num(x0)}" x2="${num(x1)}" y1="${num(yBottom)}" y2="${num(yBottom)}"/>`);
  parts.push(
    `<text class="axis-label" x="14" y="${num((top + yBottom) / 2)}" text-anchor="middle" ` +
      `transform="rotate(-90 14 ${num((top + yBottom) / 2)})">${label}</text>`,
  );
  return parts;
}

/**
 * Error ratio along the execution order (log scale), the threshold as a dashed line, the change point as a
 * vertical line. `highlight` rings the named component (a code lens's module).
 */
export function seriesSvg(plots: Plots, highlight?: string, box: Box = SERIES_BOX): string {
  const series = plots.series ?? [];
  const n = series.length;
  const { parts, scale, x0, x1, top, yBottom } = logPlotFrame(box, series.map((p) => p.error_ratio ?? null),
    plots.threshold, {
      cls: "series", id: "series-plot", aria: "Error ratio along the execution order, log scale",
      yLabel: "error ratio (log)", xLabel: `compared components in execution order (${n})`, xLabelDrop: 8,
    });
  // threshold
  if (usable(plots.threshold)) {
    const ty = scale.y(plots.threshold);
    parts.push(
      `<line class="threshold" id="threshold-line" data-ratio="${plots.threshold}" x1="${num(x0)}" x2="${num(x1)}" ` +
        `y1="${num(ty)}" y2="${num(ty)}"/>`,
    );
    parts.push(`<text class="threshold-label" x="${num(x1 - 4)}" y="${num(ty - 5)}" text-anchor="end">threshold ${plots.threshold}</text>`);
  }
  // change point
  const cp = plots.change_point;
  if (typeof cp === "number" && Number.isInteger(cp) && cp >= 0 && cp < n) {
    const cx = seriesX(cp, n, x0, x1);
    parts.push(
      `<line class="change-point" id="change-point-line" data-index="${cp}" x1="${num(cx)}" x2="${num(cx)}" ` +
        `y1="${num(top)}" y2="${num(yBottom)}"/>`,
    );
    const anchor = cx > (x0 + x1) / 2 ? "end" : "start";
    const dx = anchor === "end" ? -5 : 5;
    parts.push(
      `<text class="change-point-label" x="${num(cx + dx)}" y="${num(top - 8)}" text-anchor="${anchor}">` +
        `change point: ${escapeXml(series[cp].component)}</text>`,
    );
  }
  // input ratios (faint) and error ratios, broken where a value is missing
  for (const [key, cls] of [["input_ratio", "input-line"], ["error_ratio", "ratio-line"]] as const) {
    let run: string[] = [];
    const flush = () => {
      if (run.length > 1) parts.push(`<polyline class="${cls}" points="${run.join(" ")}"/>`);
      run = [];
    };
    series.forEach((p, i) => {
      const r = p[key];
      if (usable(r)) run.push(`${num(seriesX(i, n, x0, x1))},${num(scale.y(r))}`);
      else flush();
    });
    flush();
  }
  series.forEach((p, i) => {
    if (!usable(p.error_ratio)) return;
    const above = usable(plots.threshold) && p.error_ratio > plots.threshold;
    const px = num(seriesX(i, n, x0, x1));
    const py = num(scale.y(p.error_ratio));
    if (highlight !== undefined && p.component === highlight) {
      parts.push(`<circle class="highlight" cx="${px}" cy="${py}" r="7"/>`);
    }
    parts.push(
      `<circle class="point${above ? " above" : ""}" data-index="${i}" cx="${px}" cy="${py}" r="3">` +
        `<title>${escapeXml(`${i}. ${p.component} (${p.class}): error ratio ${formatRatio(p.error_ratio)}×` +
          (usable(p.input_ratio) ? `, input ${formatRatio(p.input_ratio)}×` : ""))}</title></circle>`,
    );
  });
  parts.push("</svg>");
  return parts.join("");
}

/** Colour of a heat-map cell: neutral grey-blue at ratio ≤ 1, through amber at the threshold, to red. */
export function heatColor(ratio: number, threshold: number, max: number): string {
  const lr = Math.log10(clampRatio(ratio));
  const lt = Math.log10(Math.max(threshold, 1.0001));
  const lm = Math.max(Math.log10(clampRatio(max)), lt + 1e-6);
  const mix = (a: number[], b: number[], t: number) => a.map((v, k) => Math.round(v + (b[k] - v) * t));
  const cool = [70, 110, 160];
  const amber = [235, 180, 60];
  const red = [215, 40, 40];
  let rgb: number[];
  if (lr <= 0) rgb = cool;
  else if (lr <= lt) rgb = mix(cool, amber, lr / lt);
  else rgb = mix(amber, red, Math.min(1, (lr - lt) / (lm - lt)));
  return `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
}

export interface HeatLayout {
  left: number;
  top: number;
  /** Cell width (per token position) and height (per layer). */
  cw: number;
  ch: number;
  width: number;
  height: number;
}

export function heatLayout(h: HeatMap, maxWidth = SERIES_BOX.width): HeatLayout {
  const left = 72;
  const top = 8;
  const cols = Math.max(1, (h.positions ?? []).length);
  const cw = Math.max(3, Math.min(22, Math.floor((maxWidth - left - 12) / cols)));
  const ch = Math.max(14, Math.min(22, cw));
  return { left, top, cw, ch, width: left + cols * cw + 12, height: top + (h.layers ?? []).length * ch + 40 };
}

function shortLayer(name: string): string {
  const m = /(layers?\.\d+)$/.exec(name);
  return m ? m[1] : name;
}

/** Decoder layer × token position, the residual stream's error ratio per cell (max over sequences). */
export function heatmapSvg(h: HeatMap, threshold: number): string {
  const L = heatLayout(h);
  const { layers = [], positions = [], ratios = [] } = h;
  const vals = ratios.flat().filter(usable);
  const max = vals.length ? Math.max(...vals) : threshold;
  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" class="plot heatmap" id="heatmap-plot" data-width="${L.width}" ` +
      `viewBox="0 0 ${L.width} ${L.height}" role="img" aria-label="Error ratio per decoder layer and token position">`,
  );
  layers.forEach((layer, row) => {
    const y = L.top + row * L.ch;
    parts.push(`<text class="tick" x="${L.left - 6}" y="${num(y + L.ch / 2 + 4)}" text-anchor="end">${escapeXml(shortLayer(layer))}</text>`);
    positions.forEach((pos, col) => {
      const r = ratios[row]?.[col];
      if (!usable(r)) return;
      const x = L.left + col * L.cw;
      parts.push(
        `<rect class="cell" data-layer="${row}" data-position="${pos}" x="${x}" y="${y}" width="${L.cw}" ` +
          `height="${L.ch}" fill="${heatColor(r, threshold, max)}"><title>${escapeXml(
            `${layer}, token ${pos}: error ratio ${formatRatio(r)}×`,
          )}</title></rect>`,
      );
    });
  });
  const step = Math.max(1, Math.ceil(24 / L.cw));
  const yLabels = L.top + layers.length * L.ch + 14;
  positions.forEach((pos, col) => {
    if (col % step !== 0) return;
    parts.push(`<text class="tick" x="${num(L.left + col * L.cw + L.cw / 2)}" y="${yLabels}" text-anchor="middle">${pos}</text>`);
  });
  parts.push(
    `<text class="axis-label" x="${num(L.left + (positions.length * L.cw) / 2)}" y="${yLabels + 18}" ` +
      `text-anchor="middle">token position</text>`,
  );
  parts.push("</svg>");
  return parts.join("");
}

/** The pieces the graph plot draws, in order: the graph's pieces along the graph, then the suspect layer's children
 * (the second level of the split), as ekka_core/report/graph_section.py plots them. */
export function graphPieces(g: GraphLocalisation): PieceResult[] {
  return [...(g.pieces ?? []), ...(g.inner_pieces ?? [])];
}

/** A piece's state in words: departs, agrees, or why it has no ratio of its own. */
export function pieceState(p: PieceResult): string {
  if (p.departs) return "departs";
  if (p.error_ratio === null || p.error_ratio === undefined) {
    return p.covered_by_children ? "compared child by child" : "not compared";
  }
  return "agrees";
}

/** Height of the stub a piece without a ratio gets, and the least height of a compared bar. */
export const STUB_HEIGHT = 6;
const MIN_BAR = 2;

/** A piece's axis label: its module path's last two parts, three when the middle one is a layer number
 * ("layers.1.mlp", "layers.0", "model.norm"). */
export function pieceLabel(module: string): string {
  const parts = module.split(".");
  const k = parts.length >= 3 && /^\d+$/.test(parts[parts.length - 2]) ? 3 : 2;
  return parts.slice(-k).join(".");
}

/**
 * The compiled-vs-eager error ratio of each piece of the engine's compiled graph, one bar per piece in graph order
 * (pieces, then inner pieces) on a log scale, the threshold as a dashed line. A departing piece is red; a piece
 * without a ratio (not compared, or compared child by child) is a grey stub with its state written on it, never
 * a bar of zero height that would read as agreement.
 */
export function graphSvg(g: GraphLocalisation, box: Box = GRAPH_BOX): string {
  const pieces = graphPieces(g);
  const n = pieces.length;
  const { parts, scale, x0, x1, top, yBottom } = logPlotFrame(box, pieces.map((p) => p.error_ratio ?? null),
    g.threshold, {
      cls: "graph", id: "graph-plot", aria: "Compiled vs eager error ratio per piece of the graph, log scale",
      yLabel: "compiled vs eager (log)", xLabel: `pieces of the compiled graph in graph order (${n})`, xLabelDrop: 6,
    });
  const step = (x1 - x0) / Math.max(n, 1);
  const bw = step * 0.7;
  // where the suspect layer's own children start
  const outer = (g.pieces ?? []).length;
  if (outer > 0 && outer < n) {
    const dx = x0 + outer * step;
    parts.push(
      `<line class="inner-divider" id="inner-divider" data-index="${outer}" x1="${num(dx)}" x2="${num(dx)}" ` +
        `y1="${num(top)}" y2="${num(yBottom)}"/>`,
    );
    const inside = g.suspect?.module ? `inside ${g.suspect.module}` : "inner pieces";
    parts.push(`<text class="inner-label" x="${num(dx + 4)}" y="${num(top - 8)}">${escapeXml(inside)} →</text>`);
  }
  pieces.forEach((p, i) => {
    const x = x0 + i * step + (step - bw) / 2;
    const cx = x0 + (i + 0.5) * step;
    const r = p.error_ratio;
    const state = pieceState(p);
    const why = p.not_compared && !p.covered_by_children ? ` (${p.not_compared})` : "";
    const worst = usable(p.worst_row_ratio)
      ? `; worst row${typeof p.worst_row === "number" ? ` ${p.worst_row}` : ""} ${formatRatio(p.worst_row_ratio)}×`
      : "";
    const tip = `${p.index}. ${p.module} (${p.module_class ?? ""}), ${p.nodes} node${p.nodes === 1 ? "" : "s"}: ` +
      `compiled vs eager ${formatRatio(r)}×${worst} — ${state}${why}`;
    const title = `<title>${escapeXml(tip)}</title>`;
    const data = `data-index="${p.index}" data-module="${escapeXml(p.module)}" data-state="${escapeXml(state)}"`;
    if (r === null || r === undefined) {
      const sy = yBottom - STUB_HEIGHT;
      parts.push(
        `<rect class="bar stub" ${data} x="${num(x)}" y="${num(sy)}" width="${num(bw)}" height="${STUB_HEIGHT}">${title}</rect>`,
      );
      parts.push(
        `<text class="stub-label" x="${num(cx + 3)}" y="${num(sy - 4)}" text-anchor="start" ` +
          `transform="rotate(-90 ${num(cx + 3)} ${num(sy - 4)})">${escapeXml(state)}</text>`,
      );
    } else {
      const y = usable(r) ? Math.min(scale.y(r), yBottom - MIN_BAR) : yBottom - MIN_BAR;
      parts.push(
        `<rect class="bar${p.departs ? " departs" : ""}" ${data} data-ratio="${r}" x="${num(x)}" y="${num(y)}" ` +
          `width="${num(bw)}" height="${num(yBottom - y)}">${title}</rect>`,
      );
    }
    if (n <= 40) {
      const ly = yBottom + 12;
      parts.push(
        `<text class="tick piece-label" x="${num(cx)}" y="${num(ly)}" text-anchor="end" ` +
          `transform="rotate(-35 ${num(cx)} ${num(ly)})">${escapeXml(pieceLabel(p.module))}</text>`,
      );
    }
  });
  if (usable(g.threshold)) {
    const ty = scale.y(g.threshold);
    parts.push(
      `<line class="threshold" id="graph-threshold-line" data-ratio="${g.threshold}" x1="${num(x0)}" x2="${num(x1)}" ` +
        `y1="${num(ty)}" y2="${num(ty)}"/>`,
    );
    parts.push(
      `<text class="threshold-label halo" x="${num(x0 + 4)}" y="${num(ty - 5)}" text-anchor="start">` +
        `threshold ${formatRatio(g.threshold)}× (clean compiled noise)</text>`,
    );
  }
  parts.push("</svg>");
  return parts.join("");
}

/** The page's "Inside the compiled graph" section of a report with a `graph` localisation: the bar plot, the
 * suspect piece's graph nodes and the compiler stages; an unreplayable graph says why; no section without one. */
export function graphSection(report: Report): string {
  const g = report.graph;
  if (g === null || g === undefined || typeof g !== "object") return "";
  const out: string[] = [`<h2 id="graph-heading">Inside the compiled graph</h2>`];
  if (!g.replayable) {
    out.push(`<p id="graph-reason">The compiled graph could not be localised: ${escapeXml(g.reason ?? "no reason given")}</p>`);
    return `<section id="graph">${out.join("")}</section>`;
  }
  const pieces = graphPieces(g);
  if (!pieces.length) {
    out.push(`<p id="graph-no-pieces">The compiled graph was replayed but has no pieces to plot.</p>`);
    return `<section id="graph">${out.join("")}</section>`;
  }
  const rows = usable(g.row_threshold) ? `, per token row ${formatRatio(g.row_threshold)}×` : "";
  out.push(
    `<div class="sub">Compiled vs eager on the engine's own graph and first-step inputs (threshold ` +
      `${formatRatio(g.threshold)}×${rows}${g.dtype ? `; ${escapeXml(g.dtype)}` : ""}).</div>`,
  );
  out.push(graphSvg(g));
  const nodes = g.suspect_nodes ?? [];
  if (nodes.length) {
    const of = g.suspect?.module ? ` of <code>${escapeXml(g.suspect.module)}</code>` : "";
    const words = g.node_words ? ` (${escapeXml(g.node_words)})` : "";
    out.push(`<p>Graph nodes${of}${words}:</p><ul id="graph-nodes">`);
    for (const nd of nodes) {
      const at = nd.file ? ` at <code>${escapeXml(formatLocation(nd.file, nd.line, true))}</code>` : "";
      out.push(
        `<li><code>${escapeXml(nd.node)}</code> (${escapeXml(nd.op)})${at}` +
          `${nd.code ? ` <code>${escapeXml(nd.code)}</code>` : ""}</li>`,
      );
    }
    out.push(`</ul>`);
  }
  const passes = g.passes ?? [];
  if (passes.length) {
    out.push(`<p>Compiler stages whose removal brings it back within noise:</p><ul id="graph-stages">`);
    for (const f of passes) out.push(`<li>${escapeXml(f.stage)} <code>${escapeXml(f.name)}</code>: ${escapeXml(f.words)}</li>`);
    out.push(`</ul>`);
  } else if (g.suspect && (g.tried_toggles ?? []).length) {
    out.push(`<p id="graph-no-stage">No single compiler stage tried turns it off: ${escapeXml((g.tried_toggles ?? []).join("; "))}</p>`);
  }
  for (const note of g.notes ?? []) out.push(`<p class="note">${escapeXml(note)}</p>`);
  return `<section id="graph">${out.join("")}</section>`;
}

function legend(threshold: number, max: number): string {
  const stops = [1, threshold, Math.sqrt(threshold * Math.max(max, threshold)), Math.max(max, threshold)];
  const items = stops.map(
    (r, i) =>
      `<rect x="${i * 90}" y="0" width="14" height="14" fill="${heatColor(r, threshold, max)}"/>` +
      `<text class="tick" x="${i * 90 + 20}" y="12">${formatRatio(r)}×</text>`,
  );
  return `<svg xmlns="http://www.w3.org/2000/svg" class="legend" width="${stops.length * 90}" height="16">${items.join("")}</svg>`;
}

export interface PageOptions {
  /** The webview's `cspSource`. */
  cspSource: string;
  /** A fresh random nonce for this page's <style> and <script>. */
  nonce: string;
  jobId: string;
  /** Component to ring in the plot (from a code lens). */
  highlight?: string;
  /** What was diagnosed (spec or script path), for the heading. */
  subject?: string;
  /** The verdict in a few words as the server sent it (`ReportUpdated.headline`): the heading of a report that is
   * neither divergent nor consistent ("inconclusive: could not observe modules"). */
  headline?: string;
}

export function contentSecurityPolicy(cspSource: string, nonce: string): string {
  return [
    "default-src 'none'",
    `img-src ${cspSource} data:`,
    `style-src 'nonce-${nonce}'`,
    `script-src 'nonce-${nonce}'`,
  ].join("; ");
}

const STYLE = `
body { font-family: var(--vscode-font-family); font-size: var(--vscode-font-size); color: var(--vscode-foreground); padding: 0 16px 24px; }
h1 { font-size: 1.3em; margin: 14px 0 4px; } h2 { font-size: 1.05em; margin: 22px 0 6px; }
.verdict-divergent { color: var(--vscode-errorForeground); } .sub { opacity: .8; }
svg.plot { display: block; width: 100%; height: auto; }
svg.series { max-width: ${SERIES_BOX.width}px; }
svg.heatmap { max-width: ${SERIES_BOX.width}px; }
svg.graph { max-width: ${GRAPH_BOX.width}px; }
.plot text, .legend text { fill: var(--vscode-foreground); font-size: 11px; font-family: var(--vscode-font-family); }
.grid { stroke: var(--vscode-editorWidget-border, #8884); stroke-width: .5; }
.axis { stroke: var(--vscode-foreground); stroke-width: 1; opacity: .7; }
.threshold { stroke: var(--vscode-editorWarning-foreground, #d80); stroke-width: 1.2; stroke-dasharray: 5 4; }
.threshold-label { fill: var(--vscode-editorWarning-foreground, #d80) !important; }
.change-point { stroke: var(--vscode-errorForeground, #e44); stroke-width: 1.5; }
.change-point-label { fill: var(--vscode-errorForeground, #e44) !important; font-weight: bold; }
.ratio-line { fill: none; stroke: var(--vscode-charts-blue, #38f); stroke-width: 1.5; }
.input-line { fill: none; stroke: var(--vscode-charts-foreground, #888); stroke-width: 1; opacity: .45; stroke-dasharray: 2 3; }
.point { fill: var(--vscode-charts-blue, #38f); } .point.above { fill: var(--vscode-errorForeground, #e44); }
.highlight { fill: none; stroke: var(--vscode-charts-yellow, #fc0); stroke-width: 2.5; }
.bar { fill: var(--vscode-charts-green, #2c7); } .bar.departs { fill: var(--vscode-errorForeground, #e44); }
.bar.stub { fill: var(--vscode-disabledForeground, #999); opacity: .7; }
.stub-label { fill: var(--vscode-disabledForeground, #999) !important; font-size: 9px !important; }
.halo { paint-order: stroke; stroke: var(--vscode-editor-background, #fff); stroke-width: 3px; stroke-linejoin: round; }
.inner-divider { stroke: var(--vscode-foreground); stroke-width: 1; stroke-dasharray: 3 3; opacity: .5; }
.note { opacity: .8; font-size: .9em; }
.cell { stroke: var(--vscode-editor-background, #000); stroke-width: .5; }
table { border-collapse: collapse; margin-top: 6px; width: 100%; } th, td { text-align: left; padding: 3px 10px 3px 0; overflow-wrap: anywhere; }
tr.suspect { cursor: pointer; } tr.suspect:hover { background: var(--vscode-list-hoverBackground); }
tr.current { outline: 1px solid var(--vscode-focusBorder); }
code { font-family: var(--vscode-editor-font-family); }
`;

/** The whole webview page: heading, the two plots, the suspects table; strict CSP with a nonce. */
export function divergenceHtml(report: Report, o: PageOptions): string {
  const plots = report.plots;
  const threshold = plots?.threshold ?? report.threshold ?? 2;
  const verdict = report.verdict ?? "inconclusive";
  const top = [...(report.suspects ?? [])].sort((a, b) => a.rank - b.rank);
  const current = o.highlight !== undefined ? top.find((s) => s.target.module === o.highlight) : undefined;
  const heading =
    verdict === "divergent" && top.length
      ? `Divergent — #1 ${escapeXml(suspectName(top[0]))} (<code>${escapeXml(top[0].target.module)}</code>), error ratio ${formatRatio(top[0].error_ratio)}×`
      : escapeXml(verdict === "consistent" ? "Consistent with the reference" : o.headline ?? verdict);
  const body: string[] = [];
  body.push(`<h1 class="verdict-${escapeXml(verdict)}" id="verdict">${heading}</h1>`);
  const sub = [o.subject ? escapeXml(o.subject) : "", `job ${escapeXml(o.jobId)}`, report.dtype ? escapeXml(report.dtype) : "", `threshold ${threshold}`]
    .filter(Boolean)
    .join(" · ");
  body.push(`<div class="sub">${sub}${current ? ` · showing <code>${escapeXml(current.target.module)}</code>` : ""}</div>`);
  if (plots?.series?.length) {
    body.push(`<h2>Error ratio along the execution order</h2>`);
    body.push(seriesSvg(plots, o.highlight));
  } else {
    body.push(`<p id="no-plot">This report has no comparison to plot.</p>`);
  }
  if (plots?.heatmap?.layers?.length && plots.heatmap.positions?.length) {
    const vals = (plots.heatmap.ratios ?? []).flat().filter(usable);
    body.push(`<h2>Decoder layer × token position</h2>`);
    body.push(heatmapSvg(plots.heatmap, threshold));
    body.push(`<div>${legend(threshold, vals.length ? Math.max(...vals) : threshold)}</div>`);
  }
  body.push(graphSection(report));
  if (top.length) {
    body.push(`<h2>Suspects</h2><table id="suspects"><tr><th>#</th><th>module</th><th>class</th><th>source</th><th>error ratio</th><th>onset token</th></tr>`);
    for (const s of top) {
      const src = s.target.file ? formatLocation(s.target.file, s.target.line, true) : "—";
      const cls = `suspect${current === s ? " current" : ""}`;
      body.push(
        `<tr class="${cls}" data-rank="${s.rank}" title="${escapeXml(s.evidence ?? "")}"><td>${s.rank}</td><td><code>${escapeXml(s.target.module)}</code></td>` +
          `<td>${escapeXml(s.target.class ?? "")}</td><td>${escapeXml(src)}</td><td>${formatRatio(s.error_ratio)}×</td>` +
          `<td>${s.onset_token ?? "—"}</td></tr>`,
      );
    }
    body.push(`</table>`);
  }
  const script =
    `const vscode = acquireVsCodeApi();` +
    `for (const row of document.querySelectorAll("tr.suspect")) {` +
    `row.addEventListener("click", () => vscode.postMessage({ type: "open", rank: Number(row.dataset.rank) }));}`;
  return (
    `<!DOCTYPE html><html lang="en"><head><meta charset="UTF-8">` +
    `<meta http-equiv="Content-Security-Policy" content="${contentSecurityPolicy(o.cspSource, o.nonce)}">` +
    `<meta name="viewport" content="width=device-width, initial-scale=1.0"><title>Ekka: divergence</title>` +
    `<style nonce="${o.nonce}">${STYLE}</style></head><body>${body.join("")}` +
    `<script nonce="${o.nonce}">${script}</script></body></html>`
  );
}

/** 32 random alphanumerics (crypto-strong); a new one for every render. */
export function makeNonce(randomBytes: (n: number) => Uint8Array): string {
  const chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  return Array.from(randomBytes(32), (b) => chars[b % chars.length]).join("");
}
