// What a diagnosis observed, in the Silent errors view (issues 22/23): the verdict row (inconclusive a warning), "Not
// observed", "Checks", the suspects worded by their `summary` with their kind and rows, "Departures from the
// reference's rounding", "Not checked (N)" and "Notes" — the sections the server sent with the report
// (`coverage`, `coverageLine`, `headline` of ekka/reportUpdated, rendered by ekka_core/report/coverage.py; the fixtures
// carry them, checked against Python by tests/server/test_present_coverage.py), shown as they came; and the status
// bar and the divergence page of an inconclusive job.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import { TreeItemCollapsibleState, mock, resetVscodeMock, vscodeModule } from "./mocks/vscode";
import type { ReportUpdated } from "../src/protocol";

installModuleMocks({ vscode: vscodeModule });
const suspects: typeof import("../src/suspects") = require("../src/suspects");
const tree: typeof import("../src/tree") = require("../src/tree");
const cov: typeof import("../src/coverage") = require("../src/coverage");
const format: typeof import("../src/format") = require("../src/format");
const jobs: typeof import("../src/jobs") = require("../src/jobs");
const reports: typeof import("../src/reports") = require("../src/reports");
const status: typeof import("../src/status") = require("../src/status");
const plot: typeof import("../src/plot") = require("../src/plot");

type Fixture = Required<Pick<ReportUpdated, "headline" | "coverage" | "coverageLine">> & ReportUpdated;

const load = (name: string): Fixture =>
  JSON.parse(fs.readFileSync(path.join(__dirname, "..", "test", "fixtures", name), "utf8"));
const inconclusive = load("inconclusive-report-updated.json");
const findings = load("findings-report-updated.json");
const VLLM = "/opt/venv/lib/python3.11/site-packages/vllm/model_executor";

beforeEach(() => resetVscodeMock());

/** The TreeItem's ThemeIcon (id, colour id) as the mocked vscode module makes it. */
function iconOf(item: unknown): [string | undefined, string | undefined] {
  const icon = (item as { iconPath?: { id: string; color?: { id: string } } }).iconPath;
  return [icon?.id, icon?.color?.id];
}

/** The fixture as an older server sent it: the report alone, none of Python's words next to it. */
const olderServer = ({ headline, coverage, coverageLine, ...rest }: Fixture): ReportUpdated => rest;

describe("coverage sections: the server's, shown as they came (ekka_core/report/coverage.py)", () => {
  for (const [name, f] of [["inconclusive", inconclusive], ["findings", findings]] as const) {
    test(`${name}: the sections, titles, items and the coverage line are the server's`, () => {
      assert.deepEqual(cov.coverage(f)!.map(({ key, title, items }) => ({ key, title, items })), f.coverage);
      assert.equal(cov.coverageLine(f), f.coverageLine);
    });

    test(`${name}: each section is a node titled as the server's, one child per item with its texts`, () => {
      const byTitle = new Map(suspects.treeNodes(f).map((n) => [n.label, n]));
      for (const s of f.coverage) {
        const node = byTitle.get(s.title);
        assert.ok(node, `a "${s.title}" node`);
        assert.equal(node.kind, "coverage");
        assert.deepEqual(
          node.children.map((c) => (c.description === undefined ? { label: "", text: c.label } : { label: c.label, text: c.description })),
          s.items,
        );
      }
    });
  }

  test("nothing is worked out here: the view shows the server's words even where the report would say otherwise", () => {
    const f: Fixture = {
      ...inconclusive,
      coverageLine: "the server's line",
      coverage: [{ key: "missing", title: "What the server calls it", items: [{ label: "", text: "the server's words" }] }],
    };
    const roots = suspects.treeNodes(f);
    assert.deepEqual(roots.map((n) => [n.label, n.description]), [
      ["Verdict: inconclusive", "the server's line"],
      ["What the server calls it", "1"],
    ]);
    assert.equal(roots[1].children[0].label, "the server's words");
  });

  test("an older server (no coverage sent): the suspects, and one note that the coverage was not sent", () => {
    const roots = suspects.treeNodes(olderServer(findings));
    assert.deepEqual(roots.map((n) => (n.kind === "suspect" ? "suspect" : n.label)), [
      "Verdict: divergent", "suspect", "suspect", "suspect", "suspect", "suspect", "Coverage not sent by this server",
    ]);
    assert.equal(roots[0].description, undefined, "no coverage line of its own making");
    assert.deepEqual(roots.at(-1)!.children, []);
    assert.equal(cov.coverage(olderServer(findings)), undefined);
    assert.equal(cov.coverageLine(olderServer(findings)), undefined);
    const inc = suspects.treeNodes(olderServer(inconclusive));
    assert.deepEqual(inc.map((n) => n.label), ["Verdict: inconclusive", "Coverage not sent by this server"]);
  });
});

describe("an inconclusive report", () => {
  const roots = suspects.treeNodes(inconclusive);

  test("roots: the verdict, what was not observed, the checks, what was not checked, the notes", () => {
    assert.deepEqual(
      roots.map((n) => [n.kind, n.label, n.description]),
      [
        ["verdict", "Verdict: inconclusive", "0 component pairs compared; 6 not checked; could not observe: modules"],
        ["coverage", "Not observed", "1"],
        ["coverage", "Checks", "8"],
        ["coverage", "Not checked (6)", undefined],
        ["coverage", "Notes", "2"],
      ],
    );
  });

  test("the verdict is a warning (it could not look), its tooltip says what was not observed", () => {
    const item = tree.toTreeItem(roots[0]);
    assert.deepEqual(iconOf(item), ["warning", "list.warningForeground"]);
    assert.equal(item.collapsibleState, TreeItemCollapsibleState.None);
    assert.match(String(item.tooltip), /could not observe what a verdict needs:\n• no module was compared \(knowledge base: /);
    assert.equal(item.command, undefined);
  });

  test("Not observed is open, a warning, each item the report's words with the fix", () => {
    const [missing] = roots.filter((n) => n.label === "Not observed");
    const item = tree.toTreeItem(missing);
    assert.equal(item.collapsibleState, TreeItemCollapsibleState.Expanded);
    assert.deepEqual(iconOf(item), ["warning", "list.warningForeground"]);
    assert.equal(missing.children[0].label, inconclusive.report.missing![0]);
    assert.match(missing.children[0].label, /: map the components — turn the mapping rules on, or set ANTHROPIC_API_KEY/);
  });

  test("Checks: open when one could not look, each check with its status icon", () => {
    const checks = roots.find((n) => n.label === "Checks")!;
    assert.equal(tree.toTreeItem(checks).collapsibleState, TreeItemCollapsibleState.Expanded);
    const modules = checks.children.find((c) => c.label === "? modules")!;
    assert.equal(modules.description, "inconclusive — no component pair was compared");
    const item = tree.toTreeItem(modules);
    assert.deepEqual(iconOf(item), ["question", "list.warningForeground"]);
    assert.match(String(item.tooltip), /\n• no module was compared/);
    assert.deepEqual(checks.children.map((c) => c.icon), ["pass", "pass", "question", "pass", "dash", "pass", "pass", "pass"]);
  });

  test("Not checked (N): folded, one child per component `module: reason`, the root as <root>", () => {
    const unchecked = roots.find((n) => n.label === "Not checked (6)")!;
    assert.equal(tree.toTreeItem(unchecked).collapsibleState, TreeItemCollapsibleState.Collapsed);
    assert.equal(unchecked.children.length, 6);
    assert.equal(unchecked.children[0].ariaLabel, `model.embed_tokens: ${inconclusive.report.unchecked![0].reason}`);
    assert.equal(unchecked.children.at(-1)!.label, "<root>");
    assert.equal(unchecked.children.at(-1)!.description, "knowledge base: root");
  });

  test("ids are unique", () => {
    const ids: string[] = [];
    const walk = (ns: typeof roots) => ns.forEach((n) => (ids.push(n.id), walk(n.children)));
    walk(roots);
    assert.equal(new Set(ids).size, ids.length);
  });

  test("the view's message and the status summary say inconclusive", () => {
    assert.equal(
      suspects.treeMessage(inconclusive),
      "Inconclusive: the diagnosis could not observe what a verdict needs (see Not observed) · inconclusive.ekka.toml",
    );
    assert.equal(format.summarizeReport(inconclusive), inconclusive.headline);
    assert.equal(inconclusive.headline, "inconclusive: could not observe modules");
    assert.equal(format.summarizeReport(olderServer(inconclusive)), "inconclusive");
  });

  test("the divergence page's heading is the server's headline, not a bare verdict", () => {
    const page = plot.divergenceHtml(inconclusive.report, { cspSource: "c", nonce: "n", jobId: "j", headline: inconclusive.headline });
    assert.match(page, /<h1 class="verdict-inconclusive" id="verdict">inconclusive: could not observe modules<\/h1>/);
    const older = plot.divergenceHtml(inconclusive.report, { cspSource: "c", nonce: "n", jobId: "j" });
    assert.match(older, /id="verdict">inconclusive<\/h1>/);
  });

  test("the status bar shows a done inconclusive job as a warning, with what was not observed", () => {
    const tracker = new jobs.JobTracker();
    const output = { info() {}, warn() {}, error() {} } as unknown as import("vscode").LogOutputChannel;
    const r = new reports.Reports(output);
    const bar = new status.StatusBar(tracker, r);
    r.onReport(inconclusive);
    tracker.update({ jobId: inconclusive.jobId, state: "done", stage: null, verdict: "inconclusive" });
    const item = mock.statusBarItems.at(-1)!;
    assert.equal(item.text, "$(warning) Ekka: inconclusive: could not observe modules");
    assert.match(String(item.tooltip), /Not observed:\n• no module was compared/);
    tracker.update({ jobId: "other", state: "done", stage: null, verdict: "consistent" });
    assert.match(item.text, /^\$\(check\) Ekka/);
    bar.dispose();
    r.dispose();
  });
});

describe("findings of each kind", () => {
  const roots = suspects.treeNodes(findings);
  const suspectRows = roots.filter((n) => n.kind === "suspect");

  test("the verdict row: divergent, in the error colour", () => {
    assert.equal(roots[0].label, "Verdict: divergent");
    const item = tree.toTreeItem(roots[0]);
    assert.deepEqual(iconOf(item), ["bug", "list.errorForeground"]);
  });

  test("each suspect: the label as before, the report's summary verbatim after its kind", () => {
    assert.deepEqual(
      suspectRows.map((n) => [n.label, n.description]),
      findings.report.suspects.map((s) => [
        `#${s.rank} ${s.target.class}`,
        (s.kind === "module" ? "" : `${s.kind}: `) + s.summary,
      ]),
    );
    assert.equal(suspectRows[1].description, "error ratio 37.2, from token 3 (prefill)");
    assert.equal(suspectRows[0].ariaLabel, `#1 SiluAndMul · non-finite: ${findings.report.suspects[0].summary}`);
    assert.match(suspectRows[2].tooltip!, /\n\nglue: the code between self_attn and post_attention_layernorm in its forward/);
  });

  test("rows and non-finite findings name their rows (request, token position)", () => {
    const rowsOf = (n: (typeof roots)[number]) => n.children.filter((c) => c.kind === "row").map((c) => [c.label, c.description]);
    assert.deepEqual(rowsOf(suspectRows[0]), [
      ["request 0, token 5", "NaN/Inf where the reference is finite"],
      ["request 1, token 2", "NaN/Inf where the reference is finite"],
    ]);
    assert.deepEqual(rowsOf(suspectRows[3]), [["request 1, token 7", "ratio 55.1×"], ["request 1, token 8", "ratio 61.3×"]]);
    assert.deepEqual(rowsOf(suspectRows[1]), [], "a module finding has no rows");
    assert.equal(suspectRows[3].children.at(-1)!.kind, "row", "the rows come after the suspect's source rows");
  });

  test("departures from the rounding: only those not already suspects, each opening its class", () => {
    const node = roots.find((n) => n.label === "Departures from the reference's rounding")!;
    assert.deepEqual(node.children.map((c) => c.label), ["model.layers.0.input_layernorm"]);
    const d = node.children[0];
    assert.equal(d.description, "departs from the reference's own rounding (3.3× its rounding error)");
    assert.deepEqual(tree.toTreeItem(d).command?.arguments, [{ file: `${VLLM}/layers/layernorm.py`, line: 90 }]);
  });

  test("the order: verdict, suspects, then checks, departures, not checked, notes", () => {
    assert.deepEqual(roots.map((n) => (n.kind === "suspect" ? "suspect" : n.label)), [
      "Verdict: divergent", "suspect", "suspect", "suspect", "suspect", "suspect", "Checks",
      "Departures from the reference's rounding", "Not checked (1)", "Notes",
    ]);
    const checks = roots.find((n) => n.label === "Checks")!;
    assert.equal(tree.toTreeItem(checks).collapsibleState, TreeItemCollapsibleState.Collapsed);
  });

  test("a consistent report: a passing verdict row with the coverage line", () => {
    const [v] = suspects.treeNodes({
      jobId: "j",
      report: { schema: "ekka.report/1", verdict: "consistent", suspects: [], checked: 51, unchecked: [{ module: "", reason: "root" }] },
      headline: "consistent",
      coverageLine: "51 component pairs compared; 1 not checked",
      coverage: [{ key: "unchecked", title: "Not checked (1)", items: [{ label: "<root>", text: "root" }] }],
    });
    assert.deepEqual([v.label, v.description, v.icon], ["Verdict: consistent", "51 component pairs compared; 1 not checked", "pass"]);
  });
});
