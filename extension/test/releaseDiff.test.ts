// The release-diff webview (report.json `bisect`, ekka bisect): the page's escaping, +/- line classes and CSP, and
// the `ekka.showReleaseDiff` command the server's code lenses invoke with `{jobId, symbol?}`.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import * as lc from "./mocks/languageclient";
import { MockSecretStorage, Uri, mock, resetVscodeMock, vscodeModule, workspace } from "./mocks/vscode";
import type { Bisect, ReportUpdated } from "../src/protocol";

installModuleMocks({ vscode: vscodeModule, "vscode-languageclient/node": lc });
const rd: typeof import("../src/releaseDiff") = require("../src/releaseDiff");
const ext: typeof import("../src/extension") = require("../src/extension");

// The bisect section of tests/bisect/test_bisect.py::test_report_sections_render_the_releases_and_the_diff, plus a
// second changed symbol and hostile strings.
const BISECT: Bisect = {
  schema: "ekka.bisect/1",
  outcome: "regression-found",
  last_good: "1.0",
  first_bad: "1.1",
  note: "",
  custom_ops: ["torch.ops._C.rms_norm"],
  suspect: { module: "model.layers.0.self_attn.q_norm", class: "RMSNorm", file: "/x/norm.py", line: 3 },
  tried: [
    { label: "1.0", verdict: "consistent", top_suspect: null, seconds: 5.0 },
    { label: "1.1", verdict: "divergent", top_suspect: "model.layers.0.self_attn.q_norm", seconds: 6.0 },
  ],
  changes: [
    {
      symbol: "pkg.norm.rms", kind: "function", status: "changed", file_good: "/a/norm.py", line_good: 5,
      file_bad: "/b/norm.py", line_bad: 5,
      unified_diff: "--- a/norm.py\n+++ b/norm.py\n@@ -5,2 +5,2 @@\n-    old <line>\n+    new\n     same & kept\n",
    },
    {
      symbol: "pkg.norm.<script>alert(1)</script>", kind: "function", status: "added", file_good: null, line_good: null,
      file_bad: "/b/ops.py", line_bad: 9, unified_diff: "+++ b/ops.py\n+x = '\"'\n",
    },
  ],
  fix: null,
};

const fixture: ReportUpdated = JSON.parse(
  fs.readFileSync(path.join(__dirname, "..", "test", "fixtures", "demo-report-updated.json"), "utf8"),
);
const withBisect: ReportUpdated = { ...fixture, report: { ...fixture.report, bisect: BISECT } };
const OPTS = { cspSource: "https://mock.vscode-cdn.net", nonce: "N0nce", jobId: "a1b2c3d4" };

describe("release diff page", () => {
  const html = rd.releaseDiffHtml(BISECT, OPTS);

  test("diff lines get a class by their prefix", () => {
    assert.deepEqual(
      ["--- a/x", "+++ b/x", "@@ -1 +1 @@", "+new", "-old", " ctx", "\\ No newline at end of file"].map(rd.diffLineClass),
      ["d-file", "d-file", "d-hunk", "d-add", "d-del", "d-ctx", "d-meta"],
    );
    assert.match(html, /<span class="d-del">-    old &lt;line&gt;<\/span>/);
    assert.match(html, /<span class="d-add">\+    new<\/span>/);
    assert.match(html, /<span class="d-ctx">     same &amp; kept<\/span>/);
    assert.match(html, /<span class="d-hunk">@@ -5,2 \+5,2 @@<\/span>/);
  });

  test("one section per changed symbol: symbol, kind, status, both releases' files and lines", () => {
    const sections = [...html.matchAll(/<section class="change[^"]*" id="change-(\d+)"/g)].map((m) => m[1]);
    assert.deepEqual(sections, ["0", "1"]);
    assert.match(html, /<h3><code>pkg\.norm\.rms<\/code> <span class="meta">\(function, changed\)<\/span><\/h3>/);
    assert.match(html, /1\.0: \/a\/norm\.py:5 → 1\.1: \/b\/norm\.py:5/);
    assert.match(html, /1\.0: — → 1\.1: \/b\/ops\.py:9/, "an added symbol has no good-release file");
    assert.match(html, /<h1 id="headline">last good 1\.0 · first bad 1\.1<\/h1>/);
    assert.match(html, /<code>torch\.ops\._C\.rms_norm<\/code>/);
  });

  test("every report string is escaped; only the page's own nonce'd script runs", () => {
    assert.doesNotMatch(html, /<script>alert/);
    assert.match(html, /pkg\.norm\.&lt;script&gt;alert\(1\)&lt;\/script&gt;/);
    assert.match(html, /x = &#39;&quot;&#39;/);
    const scripts = [...html.matchAll(/<script([^>]*)>/g)].map((m) => m[1]);
    assert.deepEqual(scripts, [' nonce="N0nce"']);
    const csp = /<meta http-equiv="Content-Security-Policy" content="([^"]+)">/.exec(html)?.[1];
    assert.equal(csp, "default-src 'none'; img-src https://mock.vscode-cdn.net data:; style-src 'nonce-N0nce'; script-src 'nonce-N0nce'");
  });

  test("the symbol a code lens names is marked current (the page scrolls to it)", () => {
    const page = rd.releaseDiffHtml(BISECT, { ...OPTS, symbol: "pkg.norm.rms" });
    assert.match(page, /<section class="change current" id="change-0"/);
    assert.match(page, /<section class="change" id="change-1"/);
    assert.doesNotMatch(html, /class="change current"/);
  });

  test("no changes, other outcomes, a fix", () => {
    const none = rd.releaseDiffHtml({ ...BISECT, changes: [], note: "nothing <here>" }, OPTS);
    assert.match(none, /id="no-changes"/);
    assert.match(none, /<p id="note">nothing &lt;here&gt;<\/p>/);
    assert.equal(rd.bisectHeadline({ outcome: "no-regression", last_good: "2.0" }), "no regression: every release tried is consistent (newest: 2.0)");
    assert.equal(rd.bisectHeadline({ outcome: "bad-from-start", first_bad: "1.0" }), "already bad at the oldest release tried (1.0)");
    const fixed = rd.releaseDiffHtml(
      { ...BISECT, fix: { last_bad: "1.2", first_good: "1.3", changes: [{ ...BISECT.changes![0], unified_diff: "-bug\n+fixed\n" }] } },
      OPTS,
    );
    assert.match(fixed, /<h2 id="fix">Fixed in 1\.3 \(last bad 1\.2\)<\/h2>/);
    assert.match(fixed, /id="fix-0"[^]*1\.2: \/a\/norm\.py:5 → 1\.3: \/b\/norm\.py:5[^]*<span class="d-add">\+fixed<\/span>/);
  });
});

describe("ekka.showReleaseDiff", () => {
  let context: { subscriptions: { dispose(): unknown }[]; secrets: MockSecretStorage; extensionPath: string };
  let tmp: string;

  beforeEach(() => {
    resetVscodeMock();
    lc.resetLanguageClientMock();
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "ekka-diff-test-"));
    context = { subscriptions: [], secrets: new MockSecretStorage(), extensionPath: tmp };
    workspace.workspaceFolders = [{ uri: Uri.file(tmp), name: "ws", index: 0 }];
  });

  afterEach(async () => {
    await ext.deactivate();
    for (const d of context.subscriptions) d.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  async function start(): Promise<lc.LanguageClient> {
    await ext.activate(context as unknown as Parameters<typeof ext.activate>[0]).serverReady;
    return lc.LanguageClient.instances[0];
  }

  test("a code lens's {jobId, symbol} opens one panel with that report's diffs, reused after", async () => {
    const client = await start();
    const run = mock.commands.get("ekka.showReleaseDiff")!;
    client.notify("ekka/reportUpdated", withBisect);
    assert.equal(await run({ jobId: "a1b2c3d4", symbol: "pkg.norm.rms" }), true);
    assert.equal(mock.panels.length, 1);
    const panel = mock.panels[0];
    assert.equal(panel.viewType, "ekka.releaseDiff");
    assert.equal(panel.title, "Ekka: changed in 1.1");
    assert.deepEqual(panel.options.localResourceRoots, []);
    assert.match(panel.webview.html, /<section class="change current" id="change-0"/);
    assert.match(panel.webview.html, /job a1b2c3d4/);
    assert.match(panel.webview.html, /script-src 'nonce-[A-Za-z0-9]{32}'/);
    assert.equal(await run({ jobId: "a1b2c3d4" }), true);
    assert.equal(mock.panels.length, 1, "the panel is reused");
    assert.equal(panel.revealed, 1);
    assert.doesNotMatch(panel.webview.html, /class="change current"/);
    // a new report without a bisection closes it; clearing the results closes it too
    client.notify("ekka/reportUpdated", { ...fixture, jobId: "next" });
    assert.equal(panel.disposed, true);
    client.notify("ekka/reportUpdated", withBisect);
    await run({ jobId: "a1b2c3d4" });
    await mock.commands.get("ekka.clearResults")!();
    assert.equal(mock.panels[1].disposed, true);
  });

  test("without a report, or with one that has no bisection, it says so and opens nothing", async () => {
    const client = await start();
    const run = mock.commands.get("ekka.showReleaseDiff")!;
    assert.equal(await run({ jobId: "nope" }), false);
    client.notify("ekka/reportUpdated", fixture);
    assert.equal(await run({ jobId: "a1b2c3d4" }), false);
    assert.equal(mock.panels.length, 0);
    assert.match(mock.messages.at(-1)!.text, /no release bisection in this report/);
  });
});
