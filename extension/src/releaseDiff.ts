// "Ekka: release diff": the webview page for a report's `bisect` section (ekka bisect): the last good and first bad
// release, and per changed symbol its unified diff, each line coloured by its +/- prefix. Pure: no 'vscode' import;
// every report string is escaped, and the page has the same strict CSP (nonce'd style and script) as the plots.
import { formatLocation } from "./format";
import { contentSecurityPolicy, escapeXml } from "./plot";
import type { Bisect, BisectChange } from "./protocol";

export interface ReleaseDiffOptions {
  cspSource: string;
  nonce: string;
  jobId: string;
  /** The changed symbol to scroll to (a code lens on that symbol's line). */
  symbol?: string;
}

/** The CSS class of one unified-diff line: file headers, hunk headers, added, removed, context. */
export function diffLineClass(line: string): string {
  if (line.startsWith("+++") || line.startsWith("---")) return "d-file";
  if (line.startsWith("@@")) return "d-hunk";
  if (line.startsWith("+")) return "d-add";
  if (line.startsWith("-")) return "d-del";
  if (line.startsWith("\\")) return "d-meta";
  return "d-ctx";
}

/** A unified diff as one <pre>, one span per line (escaped). */
export function diffHtml(diff: string): string {
  const lines = diff.replace(/\n$/, "").split("\n");
  return `<pre class="diff">${lines.map((l) => `<span class="${diffLineClass(l)}">${escapeXml(l)}</span>`).join("\n")}</pre>`;
}

/** One-line summary of a bisection ("last good 1.0 · first bad 1.1"), as the report's bisect section says it. */
export function bisectHeadline(b: Bisect): string {
  if (b.outcome === "regression-found") return `last good ${b.last_good ?? "?"} · first bad ${b.first_bad ?? "?"}`;
  if (b.outcome === "bad-from-start") return `already bad at the oldest release tried (${b.first_bad ?? "?"})`;
  if (b.outcome === "no-regression") return `no regression: every release tried is consistent (newest: ${b.last_good ?? "?"})`;
  return String(b.outcome ?? "bisection");
}

function where(file: string | null | undefined, line: number | null | undefined): string {
  return file ? escapeXml(formatLocation(file, line, true)) : "—";
}

function changeSection(c: BisectChange, i: number, current: boolean, good: string, bad: string, prefix: string): string {
  const cls = `change${current ? " current" : ""}`;
  return (
    `<section class="${cls}" id="${prefix}-${i}" data-symbol="${escapeXml(c.symbol)}">` +
    `<h3><code>${escapeXml(c.symbol)}</code> <span class="meta">(${escapeXml(c.kind ?? "?")}, ${escapeXml(c.status ?? "?")})</span></h3>` +
    `<div class="files">${escapeXml(good)}: ${where(c.file_good, c.line_good)} → ${escapeXml(bad)}: ${where(c.file_bad, c.line_bad)}</div>` +
    (c.unified_diff ? diffHtml(c.unified_diff) : `<p class="meta">no diff</p>`) +
    `</section>`
  );
}

const STYLE = `
body { font-family: var(--vscode-font-family); font-size: var(--vscode-font-size); color: var(--vscode-foreground); padding: 0 16px 24px; }
h1 { font-size: 1.3em; margin: 14px 0 4px; } h2 { font-size: 1.05em; margin: 22px 0 6px; } h3 { font-size: 1em; margin: 18px 0 4px; }
.sub, .meta, .files { opacity: .8; } .files { font-size: .9em; margin-bottom: 4px; overflow-wrap: anywhere; }
code, pre { font-family: var(--vscode-editor-font-family); }
pre.diff { margin: 0; padding: 6px 8px; overflow-x: auto; background: var(--vscode-textCodeBlock-background, #8881); }
pre.diff span { display: block; white-space: pre; }
.d-add { color: var(--vscode-gitDecoration-addedResourceForeground, #3a3); background: var(--vscode-diffEditor-insertedLineBackground, #3a32); }
.d-del { color: var(--vscode-gitDecoration-deletedResourceForeground, #d44); background: var(--vscode-diffEditor-removedLineBackground, #d442); }
.d-hunk { color: var(--vscode-textLink-foreground, #38f); } .d-file { font-weight: bold; opacity: .8; } .d-meta { opacity: .6; }
section.current { outline: 1px solid var(--vscode-focusBorder); outline-offset: 4px; }
table { border-collapse: collapse; margin-top: 6px; } th, td { text-align: left; padding: 3px 12px 3px 0; }
`;

/** The whole page: headline, the releases tried, one section per changed symbol (and the fix's, when there is one). */
export function releaseDiffHtml(b: Bisect, o: ReleaseDiffOptions): string {
  const body: string[] = [];
  const good = b.last_good ?? "last good";
  const bad = b.first_bad ?? "first bad";
  body.push(`<h1 id="headline">${escapeXml(bisectHeadline(b))}</h1>`);
  const s = b.suspect;
  const sub = [
    s ? `suspect <code>${escapeXml(s.class ?? "?")}</code> (${escapeXml(s.module ?? "?")}${s.file ? `, ${where(s.file, s.line)}` : ""})` : "",
    `job ${escapeXml(o.jobId)}`,
  ].filter(Boolean);
  body.push(`<div class="sub">${sub.join(" · ")}</div>`);
  if (b.note) body.push(`<p id="note">${escapeXml(b.note)}</p>`);
  if (b.tried?.length) {
    body.push(`<h2>Releases diagnosed</h2><table id="tried"><tr><th>release</th><th>verdict</th><th>rank-1 suspect</th></tr>`);
    for (const t of b.tried) {
      body.push(`<tr><td>${escapeXml(t.label)}</td><td>${escapeXml(t.verdict)}</td><td>${escapeXml(t.top_suspect ?? "—")}</td></tr>`);
    }
    body.push(`</table>`);
  }
  const changes = b.changes ?? [];
  body.push(`<h2>What changed between ${escapeXml(good)} and ${escapeXml(bad)}</h2>`);
  if (changes.length === 0) {
    body.push(`<p id="no-changes">No source change found in the suspect or the engine functions it calls.</p>`);
  }
  changes.forEach((c, i) => body.push(changeSection(c, i, o.symbol !== undefined && c.symbol === o.symbol, good, bad, "change")));
  if (b.custom_ops?.length) {
    body.push(`<p class="meta">Compiled custom ops reached (no Python source to diff): ${b.custom_ops.map((x) => `<code>${escapeXml(x)}</code>`).join(", ")}</p>`);
  }
  const fix = b.fix;
  if (fix && (fix.changes?.length || fix.note)) {
    const lastBad = fix.last_bad ?? "last bad";
    const firstGood = fix.first_good ?? "first good";
    body.push(`<h2 id="fix">Fixed in ${escapeXml(firstGood)} (last bad ${escapeXml(lastBad)})</h2>`);
    if (fix.note) body.push(`<p>${escapeXml(fix.note)}</p>`);
    (fix.changes ?? []).forEach((c, i) => body.push(changeSection(c, i, false, lastBad, firstGood, "fix")));
  }
  const script = `const cur = document.querySelector("section.current"); if (cur) cur.scrollIntoView({ block: "start" });`;
  return (
    `<!DOCTYPE html><html lang="en"><head><meta charset="UTF-8">` +
    `<meta http-equiv="Content-Security-Policy" content="${contentSecurityPolicy(o.cspSource, o.nonce)}">` +
    `<meta name="viewport" content="width=device-width, initial-scale=1.0"><title>Ekka: release diff</title>` +
    `<style nonce="${o.nonce}">${STYLE}</style></head><body>${body.join("")}` +
    `<script nonce="${o.nonce}">${script}</script></body></html>`
  );
}
