// The divergence plots: positions are checked by parsing the generated SVG back (change point at the right x,
// log scale, threshold line, heat map cells), and the page's CSP.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, test } from "node:test";
import {
  GRAPH_BOX,
  SERIES_BOX,
  STUB_HEIGHT,
  contentSecurityPolicy,
  divergenceHtml,
  escapeXml,
  graphSvg,
  heatColor,
  heatLayout,
  heatmapSvg,
  logScale,
  makeNonce,
  seriesSvg,
  seriesX,
} from "../src/plot";
import type { Plots, ReportUpdated } from "../src/protocol";
import { compiledGraph, compiledReport } from "./fixtures/compiled-report";

const fixture: ReportUpdated = JSON.parse(
  fs.readFileSync(path.join(__dirname, "..", "test", "fixtures", "demo-report-updated.json"), "utf8"),
);
const plots = fixture.report.plots!;
// report.to_json() writes every field: the fixture's series and heat map are all there.
const series = plots.series!;

/** Attributes of the first element matching `id` (or a tag+class) in an SVG string. */
function attrsOf(svg: string, selector: RegExp): Record<string, string> {
  const m = selector.exec(svg);
  assert.ok(m, `element ${selector} present`);
  const out: Record<string, string> = {};
  for (const a of m[0].matchAll(/([\w-]+)="([^"]*)"/g)) out[a[1]] = a[2];
  return out;
}

function allOf(svg: string, selector: RegExp): Record<string, string>[] {
  return [...svg.matchAll(new RegExp(selector.source, "g"))].map((m) => {
    const out: Record<string, string> = {};
    for (const a of m[0].matchAll(/([\w-]+)="([^"]*)"/g)) out[a[1]] = a[2];
    return out;
  });
}

const x0 = SERIES_BOX.left;
const x1 = SERIES_BOX.width - SERIES_BOX.right;
const yTop = SERIES_BOX.top;
const yBottom = SERIES_BOX.height - SERIES_BOX.bottom;

describe("series plot (error ratio along the execution order)", () => {
  const svg = seriesSvg(plots);

  test("the change point line is vertical at the x of series[change_point]", () => {
    const cp = attrsOf(svg, /<line class="change-point"[^>]*>/);
    assert.equal(Number(cp["data-index"]), 46);
    const want = seriesX(46, series.length, x0, x1);
    assert.ok(Math.abs(Number(cp.x1) - want) < 0.01, `x1 ${cp.x1} ≈ ${want}`);
    assert.equal(cp.x1, cp.x2, "vertical");
    assert.equal(Number(cp.y1), yTop);
    assert.equal(Number(cp.y2), yBottom);
    // and it passes through the 47th point, the first one above the threshold
    const pt = attrsOf(svg, /<circle class="point above" data-index="46"[^>]*>/);
    assert.equal(pt.cx, cp.x1);
  });

  test("the change point is labelled with the component's name", () => {
    assert.match(svg, /change point: model\.layers\.3\.self_attn\.attn/);
  });

  test("the y axis is logarithmic: equal steps per decade, 1 and 10 and 100 as ticks", () => {
    const ticks = allOf(svg, /<line class="grid"[^>]*>/).map((a) => Number(a.y1));
    const labels = [...svg.matchAll(/<text class="tick"[^>]*>([^<]*)<\/text>/g)].map((m) => m[1]);
    assert.deepEqual(labels, ["0.1", "1", "10", "100"], "decades covering 0.88 … 50.5");
    const steps = ticks.slice(1).map((y, i) => ticks[i] - y);
    for (const s of steps) assert.ok(Math.abs(s - steps[0]) < 0.02, `equal decade steps ${steps}`);
    // a point's height is log10 of its ratio
    const s = logScale([1, 100], 2, yTop, yBottom);
    const perDecade = (s.y(1) - s.y(10)) as number;
    assert.ok(Math.abs(s.y(10) - s.y(100) - perDecade) < 1e-9);
    assert.ok(Math.abs(s.y(1) - s.y(Math.sqrt(10)) - perDecade / 2) < 1e-9, "√10 half-way between 1 and 10");
  });

  test("the threshold is a horizontal line at y(threshold)", () => {
    const th = attrsOf(svg, /<line class="threshold"[^>]*>/);
    assert.equal(th.y1, th.y2, "horizontal");
    assert.equal(Number(th.x1), x0);
    assert.equal(Number(th.x2), x1);
    const scale = logScale(series.map((p) => p.error_ratio ?? null), plots.threshold, yTop, yBottom);
    assert.ok(Math.abs(Number(th.y1) - scale.y(2)) < 0.01);
    assert.match(svg, /threshold 2<\/text>/);
    // between the 1 and 10 ticks, at log10(2) ≈ 0.301 of the way
    const y1 = scale.y(1);
    const y10 = scale.y(10);
    assert.ok(Math.abs((y1 - Number(th.y1)) / (y1 - y10) - Math.log10(2)) < 0.001);
  });

  test("points above the threshold are marked, the others are not", () => {
    const above = allOf(svg, /<circle class="point above"[^>]*>/).map((a) => Number(a["data-index"]));
    const want = series.flatMap((p, i) => (p.error_ratio != null && p.error_ratio > 2 ? [i] : []));
    assert.deepEqual(above, want);
    assert.ok(above.length > 0 && above[0] === 46);
  });

  test("one point per compared component with a ratio, each with a tooltip", () => {
    const points = allOf(svg, /<circle class="point[^"]*"[^>]*>/);
    assert.equal(points.length, series.filter((p) => p.error_ratio != null).length);
    assert.match(svg, /<title>46\. model\.layers\.3\.self_attn\.attn \(Attention\): error ratio 49\.7×<\/title>/);
  });

  test("a missing ratio breaks the line instead of dropping to zero", () => {
    const p: Plots = {
      ...plots,
      change_point: null,
      series: [
        { component: "a", class: "A", error_ratio: 1, input_ratio: null },
        { component: "b", class: "B", error_ratio: 1.1, input_ratio: null },
        { component: "c", class: "C", error_ratio: null, input_ratio: null },
        { component: "d", class: "D", error_ratio: 5, input_ratio: null },
        { component: "e", class: "E", error_ratio: 6, input_ratio: null },
      ],
    };
    const s = seriesSvg(p);
    assert.equal(allOf(s, /<polyline class="ratio-line"[^>]*>/).length, 2);
    assert.doesNotMatch(s, /class="change-point"/, "no change point, no line");
  });

  test("the highlighted component (code lens module) is ringed", () => {
    const s = seriesSvg(plots, "model.layers.3.self_attn.attn");
    const ring = attrsOf(s, /<circle class="highlight"[^>]*>/);
    const pt = attrsOf(s, /<circle class="point above" data-index="46"[^>]*>/);
    assert.deepEqual([ring.cx, ring.cy], [pt.cx, pt.cy]);
    assert.doesNotMatch(seriesSvg(plots), /class="highlight"/);
  });

  test("huge (non-finite stand-in) and tiny ratios stay inside the plot", () => {
    const s = logScale([1e30, 1e-9], 2, yTop, yBottom);
    assert.ok(s.y(1e30) >= yTop - 1e-9 && s.y(1e-9) <= yBottom + 1e-9);
    assert.ok(s.hi <= 12 && s.lo >= -3);
  });

  test("component names are escaped", () => {
    assert.equal(escapeXml(`<a & "b">`), "&lt;a &amp; &quot;b&quot;&gt;");
  });
});

describe("heat map (decoder layer × token position)", () => {
  const h = plots.heatmap!;
  const ratios = h.ratios!;
  const positions = h.positions!;
  const svg = heatmapSvg(h, 2);

  test("one cell per (layer, position) with a value, none for missing values", () => {
    const cells = allOf(svg, /<rect class="cell"[^>]*>/);
    const want = ratios.flat().filter((v) => v !== null).length;
    assert.equal(cells.length, want);
    assert.equal(cells.length, 292);
    const byKey = new Set(cells.map((c) => `${c["data-layer"]}:${c["data-position"]}`));
    ratios.forEach((row, li) =>
      row.forEach((v, pi) => assert.equal(byKey.has(`${li}:${positions[pi]}`), v !== null, `${li}:${pi}`)),
    );
  });

  test("cells form a grid: rows by layer, columns by position", () => {
    const L = heatLayout(h);
    for (const c of allOf(svg, /<rect class="cell"[^>]*>/)) {
      const col = positions.indexOf(Number(c["data-position"]));
      assert.equal(Number(c.x), L.left + col * L.cw);
      assert.equal(Number(c.y), L.top + Number(c["data-layer"]) * L.ch);
      assert.equal(Number(c.width), L.cw);
      assert.equal(Number(c.height), L.ch);
    }
  });

  test("the plots scale to the panel: a viewBox and no fixed pixel size", () => {
    for (const plot of [svg, seriesSvg(plots)]) {
      const el = attrsOf(plot, /<svg [^>]*>/);
      assert.match(el.viewBox, /^0 0 \d+ \d+$/);
      assert.equal(el.width, undefined);
      assert.equal(el.height, undefined);
    }
    assert.ok(heatLayout(h).width <= SERIES_BOX.width, "the heat map fits the series plot's width");
  });

  test("layer 3 past the window is hot, layer 0 is not", () => {
    const cell = (layer: number, pos: number) =>
      attrsOf(svg, new RegExp(`<rect class="cell" data-layer="${layer}" data-position="${pos}"[^>]*>`)).fill;
    const red = (fill: string) => Number(/rgb\((\d+),/.exec(fill)![1]);
    const li3 = ratios[3];
    const hot = positions[li3.findIndex((v) => v !== null && v > 10)];
    assert.ok(red(cell(3, hot)) > 200, `layer 3 token ${hot}: ${cell(3, hot)}`);
    assert.equal(cell(0, 0), "rgb(70,110,160)", "ratio ≈ 1 is the neutral colour");
  });

  test("colours: neutral at ≤ 1, amber at the threshold, red at the maximum, monotonic in between", () => {
    assert.equal(heatColor(0.5, 2, 50), "rgb(70,110,160)");
    assert.equal(heatColor(1, 2, 50), "rgb(70,110,160)");
    assert.equal(heatColor(2, 2, 50), "rgb(235,180,60)");
    assert.equal(heatColor(50, 2, 50), "rgb(215,40,40)");
    const greens = [2, 5, 10, 20, 50].map((r) => Number(/rgb\(\d+,(\d+),/.exec(heatColor(r, 2, 50))![1]));
    for (let i = 1; i < greens.length; i++) assert.ok(greens[i] <= greens[i - 1], `monotonic ${greens}`);
  });

  test("the cell tooltip names layer, token and ratio", () => {
    assert.match(svg, /<title>model\.layers\.3, token \d+: error ratio [\d.]+×<\/title>/);
  });
});

describe("webview page", () => {
  const nonce = makeNonce(() => new Uint8Array(32).map((_, i) => i * 7));
  const html = divergenceHtml(fixture.report, {
    cspSource: "https://x.vscode-cdn.net",
    nonce,
    jobId: fixture.jobId,
    highlight: "model.layers.3.self_attn.attn",
    subject: "/ws/demo.ekka.toml",
  });

  test("a strict CSP: nothing by default, style and script only with the nonce, no unsafe-inline, no remote", () => {
    const csp = /<meta http-equiv="Content-Security-Policy" content="([^"]+)">/.exec(html)?.[1];
    assert.equal(csp, contentSecurityPolicy("https://x.vscode-cdn.net", nonce));
    assert.match(csp!, /^default-src 'none'/);
    assert.match(csp!, new RegExp(`script-src 'nonce-${nonce}'`));
    assert.match(csp!, new RegExp(`style-src 'nonce-${nonce}'`));
    assert.doesNotMatch(csp!, /unsafe-inline|unsafe-eval|https?:\/\/(?!x\.vscode-cdn\.net)/);
    const scripts = [...html.matchAll(/<script([^>]*)>/g)];
    assert.equal(scripts.length, 1);
    assert.equal(scripts[0][1], ` nonce="${nonce}"`, "the one script carries the nonce, no src");
    assert.match(html, new RegExp(`<style nonce="${nonce}">`));
    assert.doesNotMatch(html, / style="/, "no inline style attributes (the CSP would block them)");
    assert.doesNotMatch(html, /<(link|img|iframe)\b/);
  });

  test("the nonce is 32 alphanumerics", () => {
    assert.match(nonce, /^[A-Za-z0-9]{32}$/);
    const a = makeNonce((n) => require("node:crypto").randomBytes(n));
    const b = makeNonce((n) => require("node:crypto").randomBytes(n));
    assert.notEqual(a, b);
  });

  test("both plots, the verdict and the suspects table are there", () => {
    assert.match(html, /id="series-plot"/);
    assert.match(html, /id="heatmap-plot"/);
    assert.match(html, /Divergent — #1 Attention/);
    assert.match(html, /<tr class="suspect current" data-rank="1"/);
    assert.match(html, /vllm\/model_executor\/layers\/attention\/attention\.py:229/);
    assert.match(html, /job a1b2c3d4/);
  });

  test("a consistent report without plots still renders", () => {
    const page = divergenceHtml({ schema: "ekka.report/1", verdict: "consistent", suspects: [] }, { cspSource: "c", nonce: "n", jobId: "j" });
    assert.match(page, /Consistent with the reference/);
    assert.match(page, /no comparison to plot/);
  });
});

describe("inside the compiled graph (report.graph: compiled vs eager per piece)", () => {
  const g = compiledGraph();
  const svg = graphSvg(g);
  const bars = allOf(svg, /<rect class="bar[^"]*"[^>]*>/);
  const gTop = GRAPH_BOX.top;
  const gBottom = GRAPH_BOX.height - GRAPH_BOX.bottom;
  const scale = logScale([...g.pieces!, ...g.inner_pieces!].map((p) => p.error_ratio), g.threshold, gTop, gBottom);
  const page = (report = compiledReport()) => divergenceHtml(report, { cspSource: "c", nonce: "n0nce", jobId: "j" });

  test("one bar per piece along the graph: the pieces, then the inner pieces, in order", () => {
    assert.equal(bars.length, g.pieces!.length + g.inner_pieces!.length);
    assert.equal(bars.length, 6);
    assert.deepEqual(bars.map((b) => Number(b["data-index"])), [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(bars.map((b) => b["data-module"]), [...g.pieces!, ...g.inner_pieces!].map((p) => p.module));
    const xs = bars.map((b) => Number(b.x));
    for (let i = 1; i < xs.length; i++) assert.ok(xs[i] > xs[i - 1], `left to right ${xs}`);
    const divider = attrsOf(svg, /<line class="inner-divider"[^>]*>/);
    assert.equal(Number(divider["data-index"]), g.pieces!.length);
    assert.ok(Number(divider.x1) > xs[3] && Number(divider.x1) < xs[4], "the divider sits between piece 3 and inner piece 4");
    assert.match(svg, /inside model\.layers\.1\.mlp →/);
    const names = [...svg.matchAll(/<text class="tick piece-label"[^>]*>([^<]*)<\/text>/g)].map((m) => m[1]);
    assert.deepEqual(names, ["model.embed_tokens", "layers.0", "layers.1", "model.norm", "layers.1.self_attn", "layers.1.mlp"]);
  });

  test("the departing pieces are red, the agreeing ones are not", () => {
    const departs = bars.filter((b) => b.class === "bar departs").map((b) => Number(b["data-index"]));
    assert.deepEqual(departs, [2, 5]);
    assert.deepEqual(bars.filter((b) => b.class === "bar").map((b) => Number(b["data-index"])), [0, 1, 4]);
    // the colour: the theme's error colour (red), as the points above the threshold in the series plot
    assert.match(page(), /\.bar\.departs \{ fill: var\(--vscode-errorForeground, #e44\); \}/);
  });

  test("bar heights are log-scaled ratios from the axis; the threshold is a horizontal line at y(threshold)", () => {
    const bar = (i: number) => bars.find((b) => Number(b["data-index"]) === i)!;
    assert.ok(Math.abs(Number(bar(5).y) - scale.y(41.2)) < 0.01, `y ${bar(5).y} ≈ ${scale.y(41.2)}`);
    assert.ok(Math.abs(Number(bar(5).y) + Number(bar(5).height) - gBottom) < 0.01, "the bar stands on the axis");
    assert.ok(Math.abs(Number(bar(1).y) - scale.y(1.2)) < 0.01);
    assert.ok(Number(bar(5).height) > Number(bar(2).height), "41.2× is taller than 38.5×");
    const th = attrsOf(svg, /<line class="threshold"[^>]*>/);
    assert.equal(th.y1, th.y2);
    assert.ok(Math.abs(Number(th.y1) - scale.y(3.2)) < 0.01);
    assert.match(svg, /threshold 3\.2× \(clean compiled noise\)<\/text>/);
    const labels = [...svg.matchAll(/<text class="tick" x[^>]*>([^<]*)<\/text>/g)].map((m) => m[1]);
    assert.deepEqual(labels, ["1", "10", "100"], "decades covering 1 … 41.2");
  });

  test("a piece that was not compared is a grey stub labelled so, never a bar of zero", () => {
    const stubs = bars.filter((b) => b.class === "bar stub");
    assert.deepEqual(stubs.map((b) => Number(b["data-index"])), [3]);
    assert.equal(Number(stubs[0].height), STUB_HEIGHT);
    assert.equal(Number(stubs[0].y), gBottom - STUB_HEIGHT);
    assert.equal(stubs[0]["data-state"], "not compared");
    assert.equal(stubs[0]["data-ratio"], undefined, "no ratio is made up for it");
    assert.match(svg, /<text class="stub-label"[^>]*>not compared<\/text>/);
    assert.ok(bars.every((b) => Number(b.height) > 0), "no zero-height bar");
    assert.match(page(), /\.bar\.stub \{ fill: var\(--vscode-disabledForeground, #999\)/);
    // compared child by child: a stub too, worded so
    const covered = compiledGraph();
    covered.pieces![3] = { ...covered.pieces![3], not_compared: "split", covered_by_children: true };
    assert.match(graphSvg(covered), /<rect class="bar stub" data-index="3"[^>]*data-state="compared child by child"/);
  });

  test("each bar's tooltip names the module, its class, the ratio and the state (text escaped)", () => {
    assert.match(svg, /<title>5\. model\.layers\.1\.mlp \(LlamaMLP\), 9 nodes: compiled vs eager 41\.2×; worst row 5 80\.3× — departs<\/title>/);
    assert.match(svg, /<title>1\. model\.layers\.0 \(LlamaDecoderLayer\), 41 nodes: compiled vs eager 1\.2×; worst row 3 1\.9× — agrees<\/title>/);
    assert.match(svg, /<title>3\. model\.norm \(RMSNorm\), 6 nodes: compiled vs eager n\/a× — not compared \(its output is a routing tie &lt;argmax&gt;\)<\/title>/);
    assert.doesNotMatch(svg, /<argmax>/);
  });

  test("the page has the section after the plots, with the suspect's nodes and the compiler stage", () => {
    const html = page();
    assert.match(html, /<h2 id="graph-heading">Inside the compiled graph<\/h2>/);
    assert.equal(allOf(html, /<svg [^>]*id="graph-plot"[^>]*>/).length, 1);
    assert.match(html, /threshold 3\.2×, per token row 6\.5×; bfloat16/);
    assert.match(html, /<li><code>silu<\/code> \(aten\.silu\) at <code>vllm\/model_executor\/layers\/activation\.py:84<\/code> <code>return F\.silu/);
    assert.match(html, /<ul id="graph-stages"><li>decomposition <code>aten\.silu\.default<\/code>: without Inductor/);
    assert.ok(html.indexOf('id="graph-heading"') < html.indexOf('id="suspects"'), "before the suspects table");
    // the CSP still holds: one nonce'd script, no inline styles
    assert.equal([...html.matchAll(/<script/g)].length, 1);
    assert.doesNotMatch(html, / style="/);
  });

  test("an unreplayable graph says why instead of plotting", () => {
    const r = compiledReport();
    r.graph = { ...compiledGraph(), replayable: false, pieces: [], inner_pieces: [], reason: "no FX graph was captured <dynamo off>" };
    const html = page(r);
    assert.match(html, /Inside the compiled graph/);
    assert.match(html, /<p id="graph-reason">The compiled graph could not be localised: no FX graph was captured &lt;dynamo off&gt;<\/p>/);
    assert.doesNotMatch(html, /id="graph-plot"|class="bar/);
  });

  test("a report without a graph localisation has no such section", () => {
    for (const report of [fixture.report, { ...compiledReport(), graph: null }]) {
      const html = page(report);
      assert.doesNotMatch(html, /Inside the compiled graph|id="graph-plot"|class="bar/);
    }
    assert.match(page(), /Inside the compiled graph/, "and the same report with one has it");
  });
});
