// Loads src/extension.ts with 'vscode' and 'vscode-languageclient/node' replaced by mocks, and checks what
// activate() wires up, that a server that cannot start never breaks activation, and what the commands do.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import * as lc from "./mocks/languageclient";
import { Uri, changeSettings, mock, resetVscodeMock, vscodeModule, window, workspace } from "./mocks/vscode";

installModuleMocks({ vscode: vscodeModule, "vscode-languageclient/node": lc });
// require(), not import: it must run after the mocks are in place (esbuild bundles it as a lazily run module).
const ext: typeof import("../src/extension") = require("../src/extension");

const EXPECTED_COMMANDS = ["ekka.clearResults", "ekka.diagnose", "ekka.restartServer"];

interface FakeContext {
  subscriptions: { dispose(): unknown }[];
}

let context: FakeContext;
let tmp: string;

function activate(): ReturnType<typeof ext.activate> {
  // The extension only touches context.subscriptions.
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
  context = { subscriptions: [] };
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "ekka-ext-test-"));
  workspace.workspaceFolders = [{ uri: Uri.file(tmp), name: "ws", index: 0 }];
});

afterEach(async () => {
  await ext.deactivate();
  for (const d of context.subscriptions) d.dispose();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe("activate", () => {
  test("registers the three commands, an Ekka output channel and a visible status bar item", async () => {
    const api = activate();
    assert.deepEqual([...mock.commands.keys()].sort(), EXPECTED_COMMANDS);
    assert.deepEqual(
      mock.outputChannels.map((c) => c.name),
      ["Ekka"],
    );
    assert.equal(mock.statusBarItems.length, 1);
    assert.equal(mock.statusBarItems[0].visible, true);
    assert.equal(mock.statusBarItems[0].command, "ekka.diagnose");
    await api.serverReady;
  });

  test("everything it creates is disposed with the extension", async () => {
    await activate().serverReady;
    for (const d of context.subscriptions) d.dispose();
    context.subscriptions = [];
    assert.equal(mock.commands.size, 0, "commands unregistered");
    assert.equal(mock.outputChannels[0].disposed, true);
    assert.equal(mock.statusBarItems[0].disposed, true);
  });

  test("the commands it registers are exactly the ones package.json contributes", async () => {
    const manifest = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "package.json"), "utf8"));
    const contributed = manifest.contributes.commands.map((c: { command: string }) => c.command).sort();
    await activate().serverReady;
    assert.deepEqual([...mock.commands.keys()].sort(), contributed);
    assert.deepEqual(Object.values(ext.COMMANDS).sort(), contributed);
  });

  test("launches `<interpreter> -m server` over stdio in the workspace root, using the setting", async () => {
    mock.settings = { interpreter: "/opt/python/bin/python3", "target.default": "sglang", executor: "ssh://gpu1" };
    assert.equal(await activate().serverReady, true);
    const client = onlyClient();
    assert.equal(client.id, "ekka");
    assert.equal(client.serverOptions.command, "/opt/python/bin/python3");
    assert.deepEqual(client.serverOptions.args, ["-m", "server"]);
    assert.equal(client.serverOptions.transport, lc.TransportKind.stdio);
    assert.equal(client.serverOptions.options?.cwd, tmp);
    assert.deepEqual(client.clientOptions.initializationOptions, {
      settings: { interpreter: "/opt/python/bin/python3", target: { default: "sglang" }, executor: "ssh://gpu1" },
    });
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
    assert.deepEqual(client.clientOptions.initializationOptions, {
      settings: { interpreter: "python3", target: { default: "vllm" }, executor: "local" },
    });
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
      { method: "workspace/executeCommand", params: { command: "ekka.server.diagnose", arguments: [file.toString()] } },
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
    assert.deepEqual(onlyClient().requests[0].params, { command: "ekka.server.diagnose", arguments: [spec.toString()] });
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
    client.notify("ekka/reportUpdated", {
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
    });
    assert.match(mock.statusBarItems[0].text, /#1 GeluAndMul · 37\.2× · from token 0/);
    await mock.commands.get("ekka.clearResults")!();
    assert.equal(client.diagnosticsCleared, 1);
    assert.doesNotMatch(mock.statusBarItems[0].text, /GeluAndMul/);
  });

  test("ekka.clearResults with no server running does not throw", async () => {
    lc.behavior.startError = new Error("spawn python3 ENOENT");
    await activate().serverReady;
    assert.doesNotThrow(() => mock.commands.get("ekka.clearResults")!());
    assert.match(outputText(), /Results cleared/);
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
