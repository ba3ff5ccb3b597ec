// The divergence plots: positions are checked by parsing the generated SVG back (change point at the right x,
// log scale, threshold line, heat map cells), and the page's CSP.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, test } from "node:test";
import {
  SERIES_BOX,
  contentSecurityPolicy,
  divergenceHtml,
  escapeXml,
  heatColor,
  heatLayout,
  heatmapSvg,
  logScale,
  makeNonce,
  seriesSvg,
  seriesX,
} from "../src/plot";
import type { Plots, ReportUpdated } from "../src/protocol";

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
