// The "Silent errors" tree built from a real report (the demo's, paths made generic): node data (pure) and the
// TreeItems VS Code gets (with the mocked vscode module), and opening a location at the right line.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import { TreeItemCollapsibleState, mock, resetVscodeMock, vscodeModule } from "./mocks/vscode";
import type { ReportUpdated } from "../src/protocol";
import { ACTIVATION, LLAMA, compiledUpdate } from "./fixtures/compiled-report";

installModuleMocks({ vscode: vscodeModule });
const suspects: typeof import("../src/suspects") = require("../src/suspects");
const tree: typeof import("../src/tree") = require("../src/tree");

const fixture: ReportUpdated = JSON.parse(
  fs.readFileSync(path.join(__dirname, "..", "test", "fixtures", "demo-report-updated.json"), "utf8"),
);
const ATTN = "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/layers/attention/attention.py";
const GEMMA3 = "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/models/gemma3.py";

beforeEach(() => resetVscodeMock());

describe("suspect nodes", () => {
  const nodes = suspects.suspectNodes(fixture);

  test("one node per suspect, ranked, labelled '#rank Class' with ratio and onset", () => {
    assert.deepEqual(
      nodes.map((n) => [n.label, n.description]),
      [
        ["#1 Attention", "49.7× · from token 16"],
        ["#2 Gemma3Attention", "48.2× · from token 16"],
      ],
    );
    assert.deepEqual(
      nodes.map((n) => n.ariaLabel),
      ["#1 Attention · 49.7× · from token 16", "#2 Gemma3Attention · 48.2× · from token 16"],
    );
  });

  test("clicking a suspect opens its class definition (file, 1-based line as in the report)", () => {
    assert.deepEqual(nodes[0].location, { file: ATTN, line: 229 });
    assert.deepEqual(nodes[1].location, { file: GEMMA3, line: 96 });
  });

  test("children: class, call site, forward(), module, reference, evidence", () => {
    assert.deepEqual(
      nodes[0].children.map((c) => [c.kind, c.label, c.description]),
      [
        ["class", "class Attention", "attention.py:229"],
        ["callSite", "called from", "gemma3.py:206"],
        ["forward", "forward()", "attention.py:488"],
        ["module", "module", "model.layers.3.self_attn.attn"],
        ["reference", "reference", "model.layers.3.self_attn.o_proj"],
        ["evidence", "evidence", "error ratio 49.7×"],
      ],
    );
    assert.deepEqual(nodes[0].children[1].location, { file: GEMMA3, line: 206 });
    assert.match(nodes[0].children[5].tooltip!, /^change point: output error ratio 49\.7/);
    assert.equal(nodes[1].children.find((c) => c.kind === "evidence")!.description, "error ratio 48.2×, input ratio 0.9×");
  });

  test("ids are unique and stable per job", () => {
    const ids = nodes.flatMap((n) => [n.id, ...n.children.map((c) => c.id)]);
    assert.equal(new Set(ids).size, ids.length);
    assert.ok(ids.every((id) => id.startsWith("a1b2c3d4/")));
  });

  test("a suspect without a source location or call site has no click target and no call-site row", () => {
    const [n] = suspects.suspectNodes({
      jobId: "j",
      report: {
        schema: "ekka.report/1",
        verdict: "divergent",
        suspects: [{ rank: 1, target: { module: "m", class: "", file: null, line: null }, reference: { modules: [] },
                     error_ratio: null, onset_token: null, evidence: "" }],
      },
    });
    assert.equal(n.label, "#1 m");
    assert.equal(n.description, "n/a×");
    assert.equal(n.location, undefined);
    assert.deepEqual(
      n.children.map((c) => c.kind),
      ["module", "reference", "evidence"],
    );
  });

  test("the view's message states the verdict", () => {
    assert.equal(suspects.treeMessage(fixture), "Divergent: 2 suspects, most likely root cause first · demo.ekka.toml");
    assert.match(
      suspects.treeMessage({ report: { schema: "", verdict: "consistent", suspects: [], threshold: 2 }, uri: null })!,
      /^Consistent: .*\(2\)$/,
    );
    assert.match(suspects.treeMessage({ report: { schema: "", verdict: "inputs-differ", suspects: [] } })!, /^Inputs differ/);
    assert.equal(suspects.treeMessage(undefined), undefined);
  });

  test("findSuspect by module (code lens) or rank", () => {
    assert.equal(suspects.findSuspect(fixture.report, "model.layers.3.self_attn")?.rank, 2);
    assert.equal(suspects.findSuspect(fixture.report, undefined, 1)?.target.class, "Attention");
    assert.equal(suspects.findSuspect(fixture.report, "nope"), undefined);
  });
});

describe("a compiled finding (compiled code departs from the same graph run eagerly)", () => {
  const [node] = suspects.suspectNodes(compiledUpdate());
  const graphKids = () => node.children.filter((c) => c.kind === "graphNode");
  const stageKid = () => node.children.find((c) => c.kind === "compilerStage")!;

  test("children: the source rows, then one per graph node, then the compiler stage", () => {
    assert.deepEqual(
      node.children.map((c) => [c.kind, c.label, c.description]),
      [
        ["class", "class LlamaMLP", "llama.py:70"],
        ["callSite", "called from", "llama.py:260"],
        ["module", "module", "model.layers.1.mlp"],
        ["reference", "reference", "model.layers.1.mlp"],
        ["evidence", "evidence", "error ratio 41.2×"],
        ["graphNode", "graph node silu", "aten.silu · activation.py:84"],
        ["graphNode", "graph node mul_3", "aten.mul · source unknown"],
        ["compilerStage", "compiler stage", "decomposition aten.silu.default"],
      ],
    );
    assert.deepEqual(node.location, { file: LLAMA, line: 70 }, "the suspect itself still opens its class");
    assert.match(node.description!, /^compiled: compiled code departs from the same graph run eagerly at aten\.silu/);
  });

  test("a graph node opens the engine line it was traced from; its tooltip shows that line's code", () => {
    const [silu, mul] = graphKids();
    assert.deepEqual(silu.location, { file: ACTIVATION, line: 84 });
    const item = tree.toTreeItem(silu);
    assert.deepEqual(item.command, { command: "ekka.openLocation", title: "Open source", arguments: [{ file: ACTIVATION, line: 84 }] });
    assert.equal(item.contextValue, "graphNode");
    assert.equal((item.iconPath as { id?: string } | undefined)?.id, "symbol-operator");
    assert.match(silu.tooltip!, /return F\.silu\(x\[\.\.\., :d\]\) \* x\[\.\.\., d:\]/);
    assert.match(silu.tooltip!, /vllm\/model_executor\/layers\/activation\.py:84/);
    assert.match(silu.tooltip!, /model\.layers\.1\.mlp\.act_fn/);
    // a node whose stack trace named no file: shown, but nothing to open
    assert.equal(mul.location, undefined);
    assert.equal(tree.toTreeItem(mul).command, undefined);
  });

  test("the compiler stage named is the first of compiler_stages, its words as the tooltip", () => {
    const u = compiledUpdate();
    u.report.suspects[0].compiler_stages = [
      { stage: "post-grad pass", name: "fuse_act_mul", ratio_without: 1.3, words: "fuse_act_mul off: agrees" },
      { stage: "decomposition", name: "aten.silu.default", ratio_without: 1.1, words: "silu decomposition off: agrees" },
    ];
    const stage = suspects.suspectNodes(u)[0].children.find((c) => c.kind === "compilerStage")!;
    assert.equal(stage.description, "post-grad pass fuse_act_mul");
    assert.match(stage.tooltip!, /^fuse_act_mul off: agrees/);
    assert.match(stageKid().tooltip!, /^without Inductor's decomposition of aten\.silu\.default/);
    assert.equal(stageKid().location, undefined);
  });

  test("no compiler stage found: one child says no single stage turns it off, listing those tried", () => {
    const u = compiledUpdate();
    u.report.suspects[0].compiler_stages = [];
    const kids = suspects.suspectNodes(u)[0].children.filter((c) => c.kind === "compilerStage");
    assert.deepEqual(kids.map((c) => [c.label, c.description]), [["no single compiler stage turns it off", undefined]]);
    assert.match(kids[0].tooltip!, /decomposition aten\.silu\.default\n.*post-grad pass fuse_act_mul/);
  });

  test("ids are unique; other kinds of finding get no graph rows", () => {
    const ids = node.children.map((c) => c.id);
    assert.equal(new Set(ids).size, ids.length);
    const u = compiledUpdate();
    u.report.suspects[0].kind = "module";
    const kinds = suspects.suspectNodes(u)[0].children.map((c) => c.kind);
    assert.ok(!kinds.includes("graphNode") && !kinds.includes("compilerStage"), kinds.join(","));
    assert.ok(suspects.suspectNodes(fixture).every((n) => n.children.every((c) => c.kind !== "graphNode")));
  });
});

describe("TreeItems", () => {
  test("the provider gives the verdict, the suspects and the notes at the root, the details as children", () => {
    const p = new tree.SuspectTreeProvider();
    let fired = 0;
    p.onDidChangeTreeData(() => fired++);
    assert.deepEqual(p.getChildren(), []);
    p.setReport(fixture);
    assert.equal(fired, 1);
    const roots = p.getChildren();
    assert.deepEqual(roots.map((n) => n.label), ["Verdict: divergent", "#1 Attention", "#2 Gemma3Attention", "Notes"]);
    assert.equal(p.getChildren(roots[1]).length, 6);
    assert.equal(p.getParent(roots[1].children[1]), roots[1]);
    assert.equal(p.getParent(roots[3].children[0]), roots[3]);
    p.setReport(undefined);
    assert.deepEqual(p.getChildren(), []);
    assert.equal(fired, 2);
  });

  test("a suspect item: label, description, icon, context value, and a command opening the class line", () => {
    const [first, second] = suspects.suspectNodes(fixture);
    const item = tree.toTreeItem(first) as unknown as InstanceType<typeof vscodeModule.TreeItem>;
    assert.equal(item.label, "#1 Attention");
    assert.equal(item.description, "49.7× · from token 16");
    assert.equal(item.collapsibleState, TreeItemCollapsibleState.Expanded, "the top suspect is expanded");
    assert.equal(tree.toTreeItem(second).collapsibleState, TreeItemCollapsibleState.Collapsed);
    assert.equal(item.contextValue, "suspect.withCallSite");
    assert.equal(item.iconPath?.id, "error");
    assert.equal(item.accessibilityInformation?.label, "#1 Attention · 49.7× · from token 16");
    assert.deepEqual(item.command, { command: "ekka.openLocation", title: "Open source", arguments: [{ file: ATTN, line: 229 }] });
    assert.equal(item.resourceUri?.fsPath, ATTN);
  });

  test("a call-site child item opens the call line; an info child has no command", () => {
    const [first] = suspects.suspectNodes(fixture);
    const call = tree.toTreeItem(first.children[1]);
    assert.equal(call.contextValue, "callSite");
    assert.equal(call.collapsibleState, TreeItemCollapsibleState.None);
    assert.deepEqual(call.command?.arguments, [{ file: GEMMA3, line: 206 }]);
    assert.equal(tree.toTreeItem(first.children[3]).command, undefined);
  });

  test("openLocation shows the file with the cursor on line - 1 (0-based), not as a preview", async () => {
    assert.equal(await tree.openLocation({ file: ATTN, line: 229 }), true);
    assert.deepEqual(mock.shownDocuments, [{ path: ATTN, line: 228, preview: false }]);
  });

  test("openLocation on a file that is not there warns instead of throwing", async () => {
    mock.missingFiles.add("/remote/only.py");
    assert.equal(await tree.openLocation({ file: "/remote/only.py", line: 3 }), false);
    assert.equal(mock.messages[0].level, "warning");
    assert.match(mock.messages[0].text, /cannot open \/remote\/only\.py:3/);
    assert.equal(await tree.openLocation(undefined), false);
  });
});
