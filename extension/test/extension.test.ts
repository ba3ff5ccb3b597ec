// Loads src/extension.ts with 'vscode' and 'vscode-languageclient/node' replaced by mocks, and checks what
// activate() wires up, that a server that cannot start never breaks activation, and what the commands do.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import * as lc from "./mocks/languageclient";
import {
  MockSecretStorage,
  Uri,
  changeSettings,
  grantWorkspaceTrust,
  mock,
  resetVscodeMock,
  vscodeModule,
  window,
  workspace,
} from "./mocks/vscode";

installModuleMocks({ vscode: vscodeModule, "vscode-languageclient/node": lc });
// require(), not import: it must run after the mocks are in place (esbuild bundles it as a lazily run module).
const ext: typeof import("../src/extension") = require("../src/extension");

const EXPECTED_COMMANDS = [
  "ekka.cancel",
  "ekka.clearApiKey",
  "ekka.clearResults",
  "ekka.diagnose",
  "ekka.openCallSite",
  "ekka.openLocation",
  "ekka.restartServer",
  "ekka.setApiKey",
  "ekka.showDivergence",
  "ekka.showLogs",
  "ekka.showReleaseDiff",
];

interface FakeContext {
  subscriptions: { dispose(): unknown }[];
  secrets: MockSecretStorage;
  extensionPath: string;
}

let context: FakeContext;
let tmp: string;

function activate(): ReturnType<typeof ext.activate> {
  // The extension only touches context.subscriptions, secrets and extensionPath.
  return ext.activate(context as unknown as Parameters<typeof ext.activate>[0]);
}

function outputText(): string {
  const ch = mock.outputChannels.find((c) => c.name === "Ekka");
  assert.ok(ch, "an output channel named Ekka exists");
  return ch.text();
}

function onlyClient(): lc.LanguageClient {
  assert.equal(lc.LanguageClient.instances.length, 1, "exactly one LanguageClient was created");
  return lc.LanguageClient.instances[0];
}

beforeEach(() => {
  resetVscodeMock();
  lc.resetLanguageClientMock();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "ekka-ext-test-"));
  // An extension folder without bundled/: the server is launched as `-m server` from the workspace.
  fs.mkdirSync(path.join(tmp, "ext"));
  context = { subscriptions: [], secrets: new MockSecretStorage(), extensionPath: path.join(tmp, "ext") };
  workspace.workspaceFolders = [{ uri: Uri.file(tmp), name: "ws", index: 0 }];
});

afterEach(async () => {
  await ext.deactivate();
  for (const d of context.subscriptions) d.dispose();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe("activate", () => {
  test("registers the commands, an Ekka output channel, a visible status bar item and the Silent errors view", async () => {
    const api = activate();
    assert.deepEqual([...mock.commands.keys()].sort(), EXPECTED_COMMANDS);
    assert.deepEqual(
      mock.outputChannels.map((c) => c.name),
      ["Ekka"],
    );
    assert.equal(mock.statusBarItems.length, 1);
    assert.equal(mock.statusBarItems[0].visible, true);
    assert.equal(mock.statusBarItems[0].command, "ekka.diagnose");
    assert.deepEqual(
      mock.treeViews.map((v) => v.id),
      ["ekka.suspects"],
    );
    await api.serverReady;
  });

  test("everything it creates is disposed with the extension", async () => {
    await activate().serverReady;
    for (const d of context.subscriptions) d.dispose();
    context.subscriptions = [];
    assert.equal(mock.commands.size, 0, "commands unregistered");
    assert.equal(mock.outputChannels[0].disposed, true);
    assert.equal(mock.statusBarItems[0].disposed, true);
    assert.equal(mock.treeViews[0].disposed, true);
  });

  test("the commands it registers are exactly the ones package.json contributes", async () => {
    const manifest = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "package.json"), "utf8"));
    const contributed = manifest.contributes.commands.map((c: { command: string }) => c.command).sort();
    await activate().serverReady;
    assert.deepEqual([...mock.commands.keys()].sort(), contributed);
    assert.deepEqual(Object.values(ext.COMMANDS).sort(), contributed);
  });

  test("launches `<interpreter> -m server` over stdio in the workspace root, using the setting", async () => {
    mock.settings = { interpreter: "/opt/python/bin/python3", "target.default": "sglang", executor: "ssh://gpu1",
                      "remote.python": "/opt/venv/bin/python", "remote.workdir": "/scratch/ekka" };
    assert.equal(await activate().serverReady, true);
    const client = onlyClient();
    assert.equal(client.id, "ekka");
    assert.equal(client.serverOptions.command, "/opt/python/bin/python3");
    assert.deepEqual(client.serverOptions.args, ["-m", "server"]);
    assert.equal(client.serverOptions.transport, lc.TransportKind.stdio);
    assert.equal(client.serverOptions.options?.cwd, tmp);
    const folderSettings = {
      workspace: tmp, interpreter: "/opt/python/bin/python3", pythonInterpreter: "", targetDefault: "sglang",
      executor: "ssh://gpu1", remote: { python: "/opt/venv/bin/python", workdir: "/scratch/ekka" }, engineArgs: {},
    };
    assert.deepEqual(client.clientOptions.initializationOptions, {
      settings: [folderSettings],
      globalSettings: { ...folderSettings, workspace: "" },
    });
    assert.equal(client.clientOptions.synchronize, undefined, "no raw configuration section is synchronised");
    assert.equal(client.clientOptions.revealOutputChannelOn, lc.RevealOutputChannelOn.Never);
    assert.equal(client.state, "running");
    assert.match(mock.statusBarItems[0].text, /Ekka/);
    assert.doesNotMatch(mock.statusBarItems[0].text, /warning/);
  });

  test("without a setting it uses the workspace .venv when there is one", async () => {
    const venvPython =
      process.platform === "win32"
        ? path.join(tmp, ".venv", "Scripts", "python.exe")
        : path.join(tmp, ".venv", "bin", "python");
    fs.mkdirSync(path.dirname(venvPython), { recursive: true });
    fs.writeFileSync(venvPython, "");
    await activate().serverReady;
    assert.equal(onlyClient().serverOptions.command, venvPython);
  });

  test("settings defaults are sent when nothing is configured", async () => {
    await activate().serverReady;
    const client = onlyClient();
    assert.equal(client.serverOptions.command, "python3");
    const defaults = {
      workspace: tmp, interpreter: "", pythonInterpreter: "", targetDefault: "vllm", executor: "local",
      remote: { python: "python3", workdir: "~/.cache/ekka-remote" }, engineArgs: {},
    };
    assert.deepEqual(client.clientOptions.initializationOptions, {
      settings: [defaults],
      globalSettings: { ...defaults, workspace: "" },
    });
  });

  test("one settings object per workspace folder: each folder's resource settings, engineArgs included", async () => {
    const second = path.join(tmp, "second");
    fs.mkdirSync(second);
    workspace.workspaceFolders = [
      { uri: Uri.file(tmp), name: "ws", index: 0 },
      { uri: Uri.file(second), name: "second", index: 1 },
    ];
    mock.settings = { interpreter: "/usr/bin/python3", engineArgs: { max_num_seqs: 8 } };
    mock.folderSettings.set(second, {
      interpreter: "${workspaceFolder}/env/bin/python",
      engineArgs: { enable_prefix_caching: true, max_num_batched_tokens: 64 },
      executor: "ssh://gpu-box",
    });
    await activate().serverReady;
    const client = onlyClient();
    const opts = client.clientOptions.initializationOptions as {
      settings: { workspace: string; interpreter: string; engineArgs: unknown; executor: string }[];
      globalSettings: { engineArgs: unknown };
    };
    assert.deepEqual(
      opts.settings.map((s) => [s.workspace, s.interpreter, s.executor, s.engineArgs]),
      [
        [tmp, "/usr/bin/python3", "local", { max_num_seqs: 8 }],
        [second, "${workspaceFolder}/env/bin/python", "ssh://gpu-box", { enable_prefix_caching: true, max_num_batched_tokens: 64 }],
      ],
      "the setting as written: the server substitutes ${workspaceFolder} with the job's folder",
    );
    assert.deepEqual(opts.globalSettings.engineArgs, { max_num_seqs: 8 });
    assert.equal(client.serverOptions.command, "/usr/bin/python3", "the server runs with the first folder's interpreter");
  });

  test("a settings change is sent to the server as the typed per-folder objects (no restart)", async () => {
    await activate().serverReady;
    const client = onlyClient();
    changeSettings({ engineArgs: { max_num_batched_tokens: 32 } });
    await tick();
    assert.equal(lc.LanguageClient.instances.length, 1, "not restarted");
    assert.equal(client.sentNotifications.length, 1);
    const { method, params } = client.sentNotifications[0] as {
      method: string;
      params: { settings: { ekka: { settings: { engineArgs: unknown }[] } } };
    };
    assert.equal(method, "workspace/didChangeConfiguration");
    assert.deepEqual(params.settings.ekka.settings[0].engineArgs, { max_num_batched_tokens: 32 });
    changeSettings({ interpreter: "/other/python" });
    await tick();
    assert.equal(lc.LanguageClient.instances.length, 2, "an interpreter change restarts the server");
  });

  test("a server that fails to start (missing interpreter) does not throw; the error is in the output", async () => {
    lc.behavior.startError = Object.assign(new Error("spawn /nope/python ENOENT"), { code: "ENOENT" });
    mock.settings = { interpreter: "/nope/python" };
    let api: ReturnType<typeof activate> | undefined;
    assert.doesNotThrow(() => {
      api = activate();
    });
    assert.equal(await api!.serverReady, false);
    assert.match(outputText(), /Could not start the Ekka server: spawn \/nope\/python ENOENT/);
    assert.match(outputText(), /ekka\.interpreter/);
    assert.match(mock.statusBarItems[0].text, /warning/);
    assert.equal(onlyClient().state, "disposed", "the failed client is cleaned up");
    assert.deepEqual([...mock.commands.keys()].sort(), EXPECTED_COMMANDS, "commands still registered");
  });

  test("a LanguageClient constructor that throws does not break activation either", async () => {
    lc.behavior.constructError = new Error("bad client options");
    const api = activate();
    assert.equal(await api.serverReady, false);
    assert.match(outputText(), /bad client options/);
  });

  test("a ${workspaceFolder} setting without a workspace is reported, not thrown", async () => {
    workspace.workspaceFolders = undefined;
    mock.settings = { interpreter: "${workspaceFolder}/.venv/bin/python" };
    assert.equal(await activate().serverReady, false);
    assert.equal(lc.LanguageClient.instances.length, 0);
    assert.match(outputText(), /no workspace folder is open/);
  });

  test("an untrusted workspace starts no server (not even on restart or a setting change) until it is trusted", async () => {
    workspace.isTrusted = false;
    mock.settings = { interpreter: "/ws/chosen/python" };
    assert.equal(await activate().serverReady, false);
    assert.equal(lc.LanguageClient.instances.length, 0, "no interpreter was launched");
    assert.match(outputText(), /not trusted/);
    assert.match(mock.statusBarItems[0].text, /shield/);
    assert.deepEqual([...mock.commands.keys()].sort(), EXPECTED_COMMANDS, "commands still registered");
    await mock.commands.get("ekka.restartServer")!();
    changeSettings({ interpreter: "/ws/other/python" });
    await tick();
    assert.equal(lc.LanguageClient.instances.length, 0, "Restart Server and an interpreter change wait for trust too");
    await mock.commands.get("ekka.diagnose")!(Uri.file(path.join(tmp, "repro.py")));
    assert.match(mock.messages.at(-1)!.text, /not running/);

    grantWorkspaceTrust();
    await mock.commands.get("ekka.restartServer")!(); // queued behind the start: waits for it to finish
    assert.equal(lc.LanguageClient.instances[0].serverOptions.command, "/ws/other/python");
    assert.equal(lc.LanguageClient.instances[0].state, "stopped", "started once trusted (then restarted)");
    assert.equal(lc.LanguageClient.instances.length, 2);
    assert.match(outputText(), /trusted now; starting the server/);
  });

  test("in a trusted workspace a trust event does not start a second server", async () => {
    await activate().serverReady;
    grantWorkspaceTrust();
    await tick();
    await tick();
    assert.equal(onlyClient().state, "running");
  });

  test("the server's error handler does not restart a crashed server behind the user's back", async () => {
    await activate().serverReady;
    const handler = onlyClient().clientOptions.errorHandler as {
      closed(): { action: lc.CloseAction; handled?: boolean };
      error(e: Error): { action: lc.ErrorAction; handled?: boolean };
    };
    assert.deepEqual(handler.closed(), { action: lc.CloseAction.DoNotRestart, handled: true });
    assert.deepEqual(handler.error(new Error("pipe broke")), { action: lc.ErrorAction.Shutdown, handled: true });
    assert.match(outputText(), /Restart Server/);
    assert.match(outputText(), /pipe broke/);
  });
});

describe("commands", () => {
  test("ekka.diagnose sends ekka.server.diagnose with the file's URI to the server", async () => {
    lc.behavior.requestResult = "job-7";
    await activate().serverReady;
    const file = Uri.file(path.join(tmp, "repro.py"));
    await mock.commands.get("ekka.diagnose")!(file);
    assert.deepEqual(onlyClient().requests, [
      { method: "workspace/executeCommand", params: { command: "ekka.server.diagnose", arguments: [{ uri: file.toString() }] } },
    ]);
    assert.match(outputText(), /job-7/);
    assert.deepEqual(mock.messages, []);
  });

  test("ekka.diagnose without an argument uses the active editor's file", async () => {
    await activate().serverReady;
    const spec = Uri.file(path.join(tmp, "gemma2.ekka.toml"));
    window.activeTextEditor = { document: { uri: spec } };
    await mock.commands.get("ekka.diagnose")!();
    assert.equal(onlyClient().requests.length, 1);
    assert.deepEqual(onlyClient().requests[0].params, {
      command: "ekka.server.diagnose",
      arguments: [{ uri: spec.toString() }],
    });
  });

  test("ekka.diagnose on a file that is neither *.py nor *.ekka.toml warns and sends nothing", async () => {
    await activate().serverReady;
    await mock.commands.get("ekka.diagnose")!(Uri.file(path.join(tmp, "README.md")));
    await mock.commands.get("ekka.diagnose")!(); // no argument, no editor
    assert.equal(onlyClient().requests.length, 0);
    assert.deepEqual(
      mock.messages.map((m) => m.level),
      ["warning", "warning"],
    );
  });

  test("ekka.diagnose while the server is down shows an error instead of throwing", async () => {
    lc.behavior.startError = new Error("spawn python3 ENOENT");
    await activate().serverReady;
    await assert.doesNotReject(async () => mock.commands.get("ekka.diagnose")!(Uri.file("/ws/repro.py")));
    assert.equal(mock.messages.length, 1);
    assert.equal(mock.messages[0].level, "error");
    assert.match(mock.messages[0].text, /not running/);
  });

  test("ekka.diagnose reports a request the server rejects", async () => {
    lc.behavior.requestError = new Error("unknown command ekka.server.diagnose");
    await activate().serverReady;
    await mock.commands.get("ekka.diagnose")!(Uri.file("/ws/repro.py"));
    assert.equal(mock.messages.length, 1);
    assert.match(mock.messages[0].text, /unknown command/);
  });

  test("ekka.restartServer stops the running client and starts a new one", async () => {
    await activate().serverReady;
    const first = onlyClient();
    await mock.commands.get("ekka.restartServer")!();
    assert.equal(first.state, "stopped");
    assert.equal(lc.LanguageClient.instances.length, 2);
    assert.equal(lc.LanguageClient.instances[1].state, "running");
  });

  test("ekka.restartServer after a failed start tries again and can succeed", async () => {
    lc.behavior.startError = new Error("No module named server");
    assert.equal(await activate().serverReady, false);
    lc.behavior.startError = undefined;
    await mock.commands.get("ekka.restartServer")!();
    assert.equal(lc.LanguageClient.instances.length, 2);
    assert.equal(lc.LanguageClient.instances[1].state, "running");
    assert.doesNotMatch(mock.statusBarItems[0].text, /warning/);
  });

  test("changing ekka.interpreter restarts the server with the new interpreter", async () => {
    await activate().serverReady;
    changeSettings({ interpreter: "/new/python" });
    await mock.commands.get("ekka.restartServer")!(); // queued behind the restart: waits for it to finish
    const launched = lc.LanguageClient.instances.map((c) => c.serverOptions.command);
    assert.deepEqual(launched.slice(0, 2), ["python3", "/new/python"]);
  });

  test("changing an unrelated setting does not restart", async () => {
    await activate().serverReady;
    changeSettings({ "target.default": "sglang" });
    await new Promise((r) => setImmediate(r));
    assert.equal(lc.LanguageClient.instances.length, 1);
  });

  test("ekka/reportUpdated shows the top suspect; ekka.clearResults clears it and the diagnostics", async () => {
    await activate().serverReady;
    const client = onlyClient();
    client.notify("ekka/jobState", { jobId: "j1", state: "done", stage: null, verdict: "divergent" });
    client.notify("ekka/reportUpdated", {
      jobId: "j1",
      report: {
        schema: "ekka.report/1",
        verdict: "divergent",
        suspects: [
          {
            rank: 1,
            target: { module: "model.layers.0.mlp.act_fn", class: "GeluAndMul" },
            error_ratio: 37.2,
            onset_token: 0,
          },
        ],
      },
    });
    assert.match(mock.statusBarItems[0].text, /#1 GeluAndMul · 37\.2× · from token 0/);
    assert.equal(mock.statusBarItems[0].command, "ekka.suspects.focus");
    assert.equal(mock.contexts.get("ekka.hasReport"), true);
    await mock.commands.get("ekka.clearResults")!();
    assert.equal(client.diagnosticsCleared, 1);
    assert.deepEqual(client.requests.at(-1), {
      method: "workspace/executeCommand",
      params: { command: "ekka.server.clear", arguments: [] },
    });
    assert.doesNotMatch(mock.statusBarItems[0].text, /GeluAndMul/);
    assert.equal(mock.contexts.get("ekka.hasReport"), false);
  });

  test("ekka.clearResults with no server running does not throw", async () => {
    lc.behavior.startError = new Error("spawn python3 ENOENT");
    await activate().serverReady;
    assert.doesNotThrow(() => mock.commands.get("ekka.clearResults")!());
    assert.match(outputText(), /Results cleared/);
  });
});

const fixture = JSON.parse(
  fs.readFileSync(path.join(__dirname, "..", "test", "fixtures", "demo-report-updated.json"), "utf8"),
);
const tick = () => new Promise((r) => setImmediate(r));

/** A server that accepts diagnose (job "j9"), cancel and clear like server/server.py. */
function fakeServer(): { calls: { command: string; args: unknown[] }[] } {
  const calls: { command: string; args: unknown[] }[] = [];
  lc.behavior.requestHandler = (method, params) => {
    assert.equal(method, "workspace/executeCommand");
    const { command, arguments: args } = params as { command: string; arguments: unknown[] };
    calls.push({ command, args });
    if (command === "ekka.server.diagnose") return { jobId: "j9" };
    if (command === "ekka.server.cancel") return { jobId: "j9", state: "cancelled", stage: "capture", message: "cancelled" };
    if (command === "ekka.server.clear") return { cleared: 1 };
    throw new Error(`unexpected ${command}`);
  };
  return { calls };
}

describe("diagnosis: progress notification, cancel, report → tree, webview", () => {
  test("diagnose shows a cancellable notification that follows ekka/jobState and closes when the job is done", async () => {
    fakeServer();
    await activate().serverReady;
    const client = onlyClient();
    const spec = Uri.file(path.join(tmp, "demo.ekka.toml"));
    assert.equal(await mock.commands.get("ekka.diagnose")!(spec), "j9");
    await tick();
    assert.equal(mock.progress.length, 1);
    const p = mock.progress[0];
    assert.equal(p.options.title, "Ekka: diagnosing demo.ekka.toml");
    assert.equal(p.options.cancellable, true);
    assert.equal(mock.contexts.get("ekka.jobRunning"), true);
    client.notify("ekka/jobState", { jobId: "j9", state: "running", stage: "capture", percent: 35, message: "tracing" });
    assert.equal(mock.statusBarItems[0].text, "$(sync~spin) Ekka: capture 35%");
    assert.equal(p.reports.at(-1)?.message, "capture: tracing");
    client.notify("ekka/reportUpdated", { ...fixture, jobId: "j9" });
    client.notify("ekka/jobState", { jobId: "j9", state: "done", stage: null, percent: 100, verdict: "divergent" });
    await p.result;
    await tick();
    assert.equal(p.done, true);
    assert.equal(mock.contexts.get("ekka.jobRunning"), false);
    assert.equal(mock.statusBarItems[0].text, "$(bug) Ekka: #1 Attention · 49.7× · from token 16");
    assert.ok(mock.executed.some((e) => e.id === "ekka.suspects.focus"), "the Silent errors view is revealed");
  });

  test("Cancel in the notification sends ekka.server.cancel {jobId}", async () => {
    const server = fakeServer();
    await activate().serverReady;
    await mock.commands.get("ekka.diagnose")!(Uri.file(path.join(tmp, "repro.py")));
    await tick();
    mock.progress[0].token.cancel();
    await tick();
    assert.deepEqual(server.calls.at(-1), { command: "ekka.server.cancel", args: [{ jobId: "j9" }] });
    await mock.progress[0].result; // the cancel's answer (state cancelled) ends the notification
    assert.equal(mock.statusBarItems[0].text, "$(circle-slash) Ekka: cancelled");
  });

  test("Ekka: Cancel diagnosis cancels the running job; with none it says so", async () => {
    const server = fakeServer();
    await activate().serverReady;
    await mock.commands.get("ekka.cancel")!();
    assert.equal(server.calls.length, 0);
    assert.match(mock.messages[0].text, /no diagnosis is running/);
    await mock.commands.get("ekka.diagnose")!(Uri.file(path.join(tmp, "repro.py")));
    await mock.commands.get("ekka.cancel")!();
    assert.deepEqual(server.calls.at(-1), { command: "ekka.server.cancel", args: [{ jobId: "j9" }] });
  });

  test("a refused diagnose (one already running) offers to cancel that job", async () => {
    const calls: unknown[] = [];
    lc.behavior.requestHandler = (_m, params) => {
      calls.push(params);
      const { command } = params as { command: string };
      if (command === "ekka.server.diagnose") {
        throw Object.assign(new Error("a diagnosis is already running"), { code: -32803, data: { jobId: "old" } });
      }
      return { jobId: "old", state: "cancelled", stage: null };
    };
    mock.messageAnswer = "Cancel it";
    await activate().serverReady;
    assert.equal(await mock.commands.get("ekka.diagnose")!(Uri.file(path.join(tmp, "repro.py"))), undefined);
    assert.match(mock.messages[0].text, /already running \(job old\)/);
    assert.deepEqual(calls.at(-1), { command: "ekka.server.cancel", arguments: [{ jobId: "old" }] });
    assert.equal(mock.progress.length, 0);
  });

  test("EKKA_INJECT_BUG in the extension host's environment is forwarded as the request's env", async () => {
    const server = fakeServer();
    process.env.EKKA_INJECT_BUG = "gemma3-sliding-window-every-layer";
    try {
      await activate().serverReady;
      const spec = Uri.file(path.join(tmp, "demo.ekka.toml"));
      await mock.commands.get("ekka.diagnose")!(spec);
      assert.deepEqual(server.calls[0].args, [
        { uri: spec.toString(), env: { EKKA_INJECT_BUG: "gemma3-sliding-window-every-layer" } },
      ]);
    } finally {
      delete process.env.EKKA_INJECT_BUG;
    }
  });

  test("the report fills the Silent errors view (message, badge) and clicking a suspect opens the class line", async () => {
    await activate().serverReady;
    onlyClient().notify("ekka/reportUpdated", fixture);
    const view = mock.treeViews[0];
    assert.equal(view.message, "Divergent: 2 suspects, most likely root cause first · demo.ekka.toml");
    assert.deepEqual(view.badge, { value: 2, tooltip: "2 suspects" });
    const provider = view.options.treeDataProvider as import("../src/tree").SuspectTreeProvider;
    const first = provider.getChildren().find((n) => n.kind === "suspect")!;
    const item = provider.getTreeItem(first);
    assert.equal(item.label, "#1 Attention");
    await mock.commands.get(item.command!.command)!(...item.command!.arguments!);
    assert.deepEqual(mock.shownDocuments.at(-1), {
      path: "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/layers/attention/attention.py",
      line: 228,
      preview: false,
    });
  });

  test("Open call site (tree context action) opens where the suspect module is called", async () => {
    await activate().serverReady;
    onlyClient().notify("ekka/reportUpdated", fixture);
    const provider = mock.treeViews[0].options.treeDataProvider as import("../src/tree").SuspectTreeProvider;
    const first = provider.getChildren().find((n) => n.kind === "suspect")!;
    await mock.commands.get("ekka.openCallSite")!(first);
    assert.deepEqual(mock.shownDocuments.at(-1), {
      path: "/opt/venv/lib/python3.11/site-packages/vllm/model_executor/models/gemma3.py",
      line: 205,
      preview: false,
    });
    await mock.commands.get("ekka.openCallSite")!({ jobId: "a1b2c3d4", module: "model.layers.3.self_attn" });
    assert.equal(mock.shownDocuments.at(-1)?.line, 263);
  });

  test("Show divergence from a code lens ({jobId, module}) opens one webview with the plots, reused after", async () => {
    await activate().serverReady;
    assert.equal(await mock.commands.get("ekka.showDivergence")!(), false, "no report yet");
    assert.equal(mock.panels.length, 0);
    onlyClient().notify("ekka/reportUpdated", fixture);
    assert.equal(await mock.commands.get("ekka.showDivergence")!({ jobId: "a1b2c3d4", module: "model.layers.3.self_attn.attn" }), true);
    assert.equal(mock.panels.length, 1);
    const panel = mock.panels[0];
    assert.equal(panel.viewType, "ekka.divergence");
    assert.equal(panel.options.enableScripts, true);
    assert.deepEqual(panel.options.localResourceRoots, []);
    assert.match(panel.webview.html, /id="series-plot"/);
    assert.match(panel.webview.html, /class="highlight"/);
    assert.match(panel.webview.html, /class="change-point"/);
    assert.match(panel.webview.html, new RegExp(`img-src ${panel.webview.cspSource.replace(/\./g, "\\.")} data:`));
    // a click on a suspect row in the page opens its source
    panel.webview.receive({ type: "open", rank: 2 });
    await tick();
    assert.equal(mock.shownDocuments.at(-1)?.line, 95);
    // the palette command reuses the panel
    await mock.commands.get("ekka.showDivergence")!();
    assert.equal(mock.panels.length, 1);
    assert.equal(panel.revealed, 1);
    // a new report refreshes the open panel
    const before = panel.webview.html;
    onlyClient().notify("ekka/reportUpdated", { ...fixture, jobId: "next" });
    assert.notEqual(panel.webview.html, before);
    assert.match(panel.webview.html, /job next/);
    // clearing closes it
    await mock.commands.get("ekka.clearResults")!();
    assert.equal(panel.disposed, true);
  });
});

describe("server launch details", () => {
  test("the bundled server is used when the extension carries one", async () => {
    const entry = path.join(tmp, "ext", "bundled", "tool", "lsp_server.py");
    fs.mkdirSync(path.dirname(entry), { recursive: true });
    fs.writeFileSync(entry, "");
    mock.settings = { interpreter: "/usr/bin/python3" };
    await activate().serverReady;
    assert.deepEqual(onlyClient().serverOptions.args, [entry]);
    assert.match(outputText(), /Starting Ekka server \(bundled\)/);
  });

  test("the Python extension's interpreter is used when the setting is empty (and only then)", async () => {
    mock.extensions.set("ms-python.python", {
      isActive: true,
      activate: async () => undefined,
      exports: {
        environments: {
          getActiveEnvironmentPath: () => ({ path: "/envs/x" }),
          resolveEnvironment: async () => ({ executable: { uri: Uri.file("/envs/x/bin/python") } }),
        },
      },
    });
    await activate().serverReady;
    assert.equal(onlyClient().serverOptions.command, "/envs/x/bin/python");
  });

  test("the client asks the server not to send work-done progress (the notification comes from ekka/jobState)", async () => {
    await activate().serverReady;
    const [feature] = onlyClient().features as { fillClientCapabilities(c: Record<string, unknown>): void }[];
    const caps: { window?: { workDoneProgress?: boolean; showMessage?: unknown } } = {
      window: { workDoneProgress: true, showMessage: {} },
    };
    feature.fillClientCapabilities(caps);
    assert.deepEqual(caps.window, { workDoneProgress: false, showMessage: {} });
  });

  test("Set Anthropic API key stores it in SecretStorage and restarts the server with ANTHROPIC_API_KEY", async () => {
    await activate().serverReady;
    assert.equal(onlyClient().serverOptions.options?.env?.ANTHROPIC_API_KEY, process.env.ANTHROPIC_API_KEY);
    mock.inputBoxAnswer = "sk-ant-xyz";
    assert.equal(await mock.commands.get("ekka.setApiKey")!(), true);
    assert.equal(context.secrets.values.get("ekka.anthropicApiKey"), "sk-ant-xyz");
    assert.equal(lc.LanguageClient.instances.length, 2, "restarted");
    assert.equal(lc.LanguageClient.instances[1].serverOptions.options?.env?.ANTHROPIC_API_KEY, "sk-ant-xyz");
    assert.doesNotMatch(JSON.stringify(lc.LanguageClient.instances[1].clientOptions), /sk-ant-xyz/, "not in initializationOptions");
    assert.doesNotMatch(outputText(), /sk-ant-xyz/, "never logged");
    assert.equal(await mock.commands.get("ekka.clearApiKey")!(), true);
    assert.equal(lc.LanguageClient.instances.length, 3);
    assert.equal(context.secrets.values.size, 0);
  });

  test("a server that stops mid-job ends the job's notification", async () => {
    fakeServer();
    await activate().serverReady;
    await mock.commands.get("ekka.diagnose")!(Uri.file(path.join(tmp, "repro.py")));
    await tick();
    const handler = onlyClient().clientOptions.errorHandler as { closed(): unknown };
    handler.closed();
    await mock.progress[0].result;
    assert.equal(mock.progress[0].done, true);
  });
});

describe("deactivate", () => {
  test("stops the running server", async () => {
    await activate().serverReady;
    await ext.deactivate();
    assert.equal(onlyClient().state, "stopped");
  });

  test("is safe when the server never started", async () => {
    lc.behavior.startError = new Error("spawn python3 ENOENT");
    await activate().serverReady;
    await assert.doesNotReject(ext.deactivate());
  });
});
