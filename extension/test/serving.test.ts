// The "Served configuration" node of the Silent errors tree (report.json `serving`, configuration triage): above
// the suspects, the culprit in words, the configurations tried, what Ekka changed to trace; absent without one.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import { TreeItemCollapsibleState, resetVscodeMock, vscodeModule } from "./mocks/vscode";
import type { ReportUpdated, Serving } from "../src/protocol";

installModuleMocks({ vscode: vscodeModule });
const suspects: typeof import("../src/suspects") = require("../src/suspects");
const tree: typeof import("../src/tree") = require("../src/tree");

const fixtures = path.join(__dirname, "..", "test", "fixtures");
const demo: ReportUpdated = JSON.parse(fs.readFileSync(path.join(fixtures, "demo-report-updated.json"), "utf8"));
const serving: Serving = JSON.parse(fs.readFileSync(path.join(fixtures, "serving-triage.json"), "utf8")).serving;

function withServing(s: unknown): ReportUpdated {
  return { ...demo, report: { ...demo.report, serving: s as Serving } };
}

beforeEach(() => resetVscodeMock());

describe("served configuration node", () => {
  const update = withServing(serving);
  const all = suspects.treeNodes(update);
  // below the verdict row, above the report's notes
  const roots = all.filter((n) => n.kind !== "verdict" && n.kind !== "coverage");
  const node = roots[0];
  const child = (kind: string) => node.children.find((c) => c.kind === kind);

  test("it comes first, above the suspects, which keep their ids and order", () => {
    assert.deepEqual(all.map((n) => n.kind), ["verdict", "serving", "suspect", "suspect", "coverage"]);
    assert.deepEqual(
      roots.map((n) => [n.kind, n.label]),
      [
        ["serving", "Served configuration: diverges (ratio 54.6×)"],
        ["suspect", "#1 Attention"],
        ["suspect", "#2 Gemma3Attention"],
      ],
    );
    assert.deepEqual(roots.slice(1), suspects.suspectNodes(demo), "the suspect nodes are unchanged");
    assert.equal(roots[1].id, "a1b2c3d4/1");
    assert.equal(node.id, "a1b2c3d4/serving");
    assert.equal(node.description, "dtype=bfloat16", "the served arguments, model path and seed left out");
    assert.match(node.tooltip!, /the engine resolved: compile mode 2, custom ops \["none"\], prefix caching true, chunk budget 4096, up to 256 requests per step/);
  });

  test("children: the culprit in words, the configurations tried, the changes made for tracing", () => {
    assert.deepEqual(
      node.children.map((c) => c.kind),
      ["servingCulprit", "servingTrials", "servingChanges"],
    );
    const culprit = child("servingCulprit")!;
    assert.equal(culprit.label, "diverges only with batch composition (several requests in one step: max_num_seqs) on");
    assert.match(culprit.tooltip!, /Culprit: batching\.\nThe suspects were traced again with batching as served\./);
  });

  test("one row per configuration: served, baseline, then each trial with ratio, ✓/✗ and seconds", () => {
    const trials = child("servingTrials")!;
    assert.equal(trials.description, "4 trials");
    assert.match(trials.tooltip!, /prefix_caching: ruled out — no request hit the prefix cache/);
    assert.deepEqual(
      trials.children.map((r) => [r.label, r.description, r.icon]),
      [
        ["served configuration", "54.6× · diverges ✓", "error"],
        ["traced baseline", "0.9× · diverges ✗", "pass"],
        ["baseline + compilation", "0.9× · diverges ✗ · 10 s", "pass"],
        ["baseline + custom_ops, batching", "54.3× · diverges ✓ · 8.6 s", "error"],
        ["baseline + custom_ops", "0.8× · diverges ✗ · 9.2 s", "pass"],
        ["baseline + batching", "54.8× · diverges ✓ · 7.7 s · culprit", "error"],
      ],
    );
    const culpritRow = trials.children[5];
    assert.match(culpritRow.tooltip!, /engine arguments: dtype=bfloat16, enforce_eager=true, .*max_num_batched_tokens=512/);
    assert.doesNotMatch(culpritRow.tooltip!, /\/models\/phi3-tiny/, "the model path is left out");
    const ids = trials.children.map((r) => r.id);
    assert.equal(new Set(ids).size, ids.length);
  });

  test("a trial says whether its compiled graph was loaded or compiled; ruled-out factors kept as served say so", () => {
    const kept = structuredClone(serving);
    kept.triage!.ruled_out = { batching: "every wave holds a single request" };
    kept.triage!.kept_as_served = ["batching"];
    kept.triage!.trials = [
      { factors: ["compilation"], args: {}, ratio: 1.0, diverges: false, seconds: 4.1, compiled_graph: "loaded" },
      { factors: ["custom_ops"], args: {}, ratio: 1.0, diverges: false, seconds: 3.0, compiled_graph: "" },
    ];
    const tried = suspects.servingNodes(withServing(kept))[0].children.find((c) => c.kind === "servingTrials")!;
    assert.match(tried.tooltip!, /batching: ruled out — every wave holds a single request; every trial keeps its served value/);
    const [compiled, eager] = tried.children.slice(2);
    assert.match(compiled.tooltip!, /compiled graph: loaded from vLLM's compile cache/);
    assert.doesNotMatch(eager.tooltip!, /compiled graph/);
  });

  test("a trial that could not run says so", () => {
    const failed = structuredClone(serving);
    failed.triage!.trials = [{ factors: ["prefix_caching"], args: {}, ratio: null, diverges: null, seconds: 0, error: "engine failed: OOM" }];
    const [row] = suspects.servingNodes(withServing(failed))[0].children.find((c) => c.kind === "servingTrials")!.children.slice(2);
    assert.deepEqual([row.label, row.description, row.icon], ["baseline + prefix_caching", "could not run", "warning"]);
    assert.match(row.tooltip!, /could not run: engine failed: OOM/);
  });

  test("both diverge (no trials run): the served and baseline rows only", () => {
    const both = structuredClone(serving);
    both.triage = { ...both.triage!, trials: [], culprit: [], traced_under: [], direction: "both",
      words: "diverges in the served configuration and in the traced baseline alike: no served feature is needed to show it" };
    const [n] = suspects.servingNodes(withServing(both));
    const tried = n.children.find((c) => c.kind === "servingTrials")!;
    assert.equal(tried.description, "served and baseline");
    assert.deepEqual(tried.children.map((r) => r.label), ["served configuration", "traced baseline"]);
    assert.doesNotMatch(n.children[0].tooltip!, /Culprit|traced again/);
  });

  test("the changes for tracing: arg=traced (served: x) — why", () => {
    const changes = child("servingChanges")!;
    assert.equal(changes.description, "5 arguments");
    assert.deepEqual(changes.children.map((c) => c.label).slice(0, 2), [
      "enforce_eager=true (served: false)",
      "compilation_config.mode=0 (served: 2)",
    ]);
    const seqs = changes.children[4];
    assert.equal(seqs.label, "max_num_seqs=1 (served: 256)");
    assert.equal(seqs.description, "requests run one at a time (no batch-composition effects)");
    assert.equal(seqs.tooltip, "max_num_seqs=1 (served: 256) — requests run one at a time (no batch-composition effects)");
  });

  test("TreeItems: the node is expanded when triage found a culprit, its groups collapsed, the top suspect still expanded", () => {
    const p = new tree.SuspectTreeProvider();
    p.setReport(update);
    const [verdict, top, first] = p.getChildren();
    assert.equal(verdict.kind, "verdict");
    assert.equal(top, p.getChildren()[1]);
    const item = tree.toTreeItem(top);
    assert.equal(item.label, "Served configuration: diverges (ratio 54.6×)");
    assert.equal(item.collapsibleState, TreeItemCollapsibleState.Expanded);
    assert.equal(item.contextValue, "serving", "no suspect context menu (Show divergence) on it");
    assert.equal(item.command, undefined);
    assert.equal(tree.toTreeItem(top.children[1]).collapsibleState, TreeItemCollapsibleState.Collapsed);
    assert.equal(tree.toTreeItem(first).collapsibleState, TreeItemCollapsibleState.Expanded);
    assert.equal(tree.toTreeItem(first).label, "#1 Attention");
    // getParent finds a trial row's group two levels down (reveal needs it)
    const row = top.children[1].children[3];
    assert.equal(p.getParent(row), top.children[1]);
    assert.equal(p.getParent(top.children[1]), top);
  });
});

describe("reports without (or with part of) a serving section", () => {
  test("no serving: no node, the suspects only", () => {
    assert.deepEqual(suspects.servingNodes(demo), []);
    assert.deepEqual(suspects.treeNodes(demo).map((n) => n.label), ["Verdict: divergent", "#1 Attention", "#2 Gemma3Attention", "Notes"]);
    assert.deepEqual(suspects.treeNodes(withServing(null)).map((n) => n.kind), ["verdict", "suspect", "suspect", "coverage"]);
  });

  test("the demo's one run (served = traced baseline, no triage): a collapsed node with no trial rows", () => {
    const [node] = suspects.servingNodes(
      withServing({
        served_args: { model: "/m", seed: 0 },
        served: { label: "served configuration (= the traced baseline: one run)", ratio: 49.7, diverges: true },
        traced: null,
        changes: [],
        triage: null,
      }),
    );
    assert.equal(node.label, "Served configuration: diverges (ratio 49.7×)");
    assert.equal(node.description, "the engine's defaults");
    assert.deepEqual(node.children, []);
    assert.equal(tree.toTreeItem(node).collapsibleState, TreeItemCollapsibleState.None);
  });

  test("a consistent served run and null members", () => {
    const [node] = suspects.servingNodes(
      withServing({ served: { label: "served configuration", ratio: 1.04, diverges: false }, changes: null, triage: null }),
    );
    assert.equal(node.label, "Served configuration: consistent (ratio 1.0×)");
    const [empty] = suspects.servingNodes(withServing({}));
    assert.equal(empty.label, "Served configuration: not checked");
    assert.deepEqual(empty.children, []);
  });
});
