// Static checks of extension/package.json: the contributions the rest of the project relies on.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { isDiagnosableFile } from "../src/format";

// Tests are bundled to out-test/, one level below the extension folder.
const extensionDir = path.join(__dirname, "..");
const manifest = JSON.parse(fs.readFileSync(path.join(extensionDir, "package.json"), "utf8"));

test("identity and entry point", () => {
  assert.equal(manifest.name, "ekka");
  assert.equal(manifest.publisher, "ekka");
  assert.equal(manifest.main, "./dist/extension.js");
  assert.equal(manifest.engines.vscode, "^1.95.0");
});

test("@types/vscode is pinned to the engines minimum (vsce refuses newer typings)", () => {
  const engineMin = manifest.engines.vscode.replace(/^\^/, "");
  assert.equal(manifest.devDependencies["@types/vscode"], engineMin);
});

test("vscode-languageclient is a runtime dependency on major 9", () => {
  assert.match(manifest.dependencies["vscode-languageclient"], /^\^9\./);
});

test("activates on Python files and on workspaces with *.ekka.toml specs", () => {
  assert.deepEqual([...manifest.activationEvents].sort(), ["onLanguage:python", "workspaceContains:**/*.ekka.toml"]);
});

test("ekka.diagnose is titled and categorised as specified", () => {
  const diagnose = manifest.contributes.commands.find((c: { command: string }) => c.command === "ekka.diagnose");
  assert.deepEqual(diagnose, {
    command: "ekka.diagnose",
    title: "Diagnose silent error",
    category: "Ekka",
    icon: "$(debug-start)",
  });
  for (const c of manifest.contributes.commands) {
    assert.equal(c.category, "Ekka", `${c.command} is in the Ekka category`);
  }
});

test("editor and explorer context menus offer ekka.diagnose on Python files and *.ekka.toml", () => {
  for (const menu of ["editor/context", "explorer/context"]) {
    const entries = manifest.contributes.menus[menu];
    assert.equal(entries.length, 1, menu);
    assert.equal(entries[0].command, "ekka.diagnose");
    assert.equal(entries[0].when, "resourceLangId == python || resourceFilename =~ /\\.ekka\\.toml$/");
  }
});

test("the menu's filename regex and isDiagnosableFile agree on spec files", () => {
  const when: string = manifest.contributes.menus["explorer/context"][0].when;
  const m = /resourceFilename =~ \/(.+)\/$/.exec(when);
  assert.ok(m, "the when clause has a resourceFilename regex");
  const re = new RegExp(m[1]);
  for (const name of ["a.ekka.toml", ".ekka.toml", "ekka.toml", "a.ekka.toml.bak", "a.toml"]) {
    assert.equal(re.test(name), isDiagnosableFile(name), name);
  }
});

test("settings: interpreter, target.default (vllm|sglang), executor (local | ssh://host)", () => {
  const props = manifest.contributes.configuration.properties;
  assert.equal(props["ekka.interpreter"].type, "string");
  assert.equal(props["ekka.interpreter"].default, "");
  assert.deepEqual(props["ekka.target.default"].enum, ["vllm", "sglang"]);
  assert.equal(props["ekka.target.default"].default, "vllm");
  assert.equal(props["ekka.executor"].type, "string");
  assert.equal(props["ekka.executor"].default, "local");
  const pattern = new RegExp(props["ekka.executor"].pattern);
  assert.ok(pattern.test("local"));
  assert.ok(pattern.test("ssh://gpu-box"));
  assert.ok(pattern.test("ssh://me@gpu-box:2222"));
  assert.ok(!pattern.test("ssh://"));
  assert.ok(!pattern.test("remote"));
  assert.ok(!pattern.test(""));
});

test("settings: ekka.engineArgs is a resource-scoped object, default {}", () => {
  const prop = manifest.contributes.configuration.properties["ekka.engineArgs"];
  assert.equal(prop.type, "object");
  assert.deepEqual(prop.default, {});
  assert.equal(prop.scope, "resource", "per workspace folder");
  assert.match(prop.markdownDescription, /engine_args/);
});

const commandTitle = (id: string) =>
  manifest.contributes.commands.find((c: { command: string }) => c.command === id) as
    | { command: string; title: string; category: string }
    | undefined;

test("palette titles: Ekka: Show divergence, Ekka: Set Anthropic API key, Ekka: Cancel diagnosis", () => {
  assert.equal(`${commandTitle("ekka.showDivergence")?.category}: ${commandTitle("ekka.showDivergence")?.title}`, "Ekka: Show divergence");
  assert.equal(`${commandTitle("ekka.setApiKey")?.category}: ${commandTitle("ekka.setApiKey")?.title}`, "Ekka: Set Anthropic API key");
  assert.equal(commandTitle("ekka.cancel")?.title, "Cancel diagnosis");
});

test("internal commands are hidden from the palette", () => {
  const hidden = manifest.contributes.menus.commandPalette
    .filter((e: { when: string }) => e.when === "false")
    .map((e: { command: string }) => e.command)
    .sort();
  assert.deepEqual(hidden, ["ekka.openCallSite", "ekka.openLocation", "ekka.showReleaseDiff"]);
});

test("a 'Silent errors' view in an Ekka activity bar container, with a welcome that offers the diagnosis", () => {
  const container = manifest.contributes.viewsContainers.activitybar.find((c: { id: string }) => c.id === "ekka");
  assert.ok(container, "activity bar container ekka");
  assert.ok(fs.existsSync(path.join(extensionDir, container.icon)), `icon ${container.icon} exists`);
  const views = manifest.contributes.views.ekka;
  assert.deepEqual(
    views.map((v: { id: string; name: string }) => [v.id, v.name]),
    [["ekka.suspects", "Silent errors"]],
  );
  const welcome = manifest.contributes.viewsWelcome.find((w: { view: string }) => w.view === "ekka.suspects");
  assert.match(welcome.contents, /\(command:ekka\.diagnose\)/);
});

test("suspect rows offer Show divergence and (with a call site) Open call site", () => {
  const item = manifest.contributes.menus["view/item/context"] as { command: string; when: string; group: string }[];
  assert.ok(item.some((e) => e.command === "ekka.showDivergence" && /viewItem =~ \/\^suspect\//.test(e.when)));
  assert.ok(item.some((e) => e.command === "ekka.openCallSite" && e.when.includes("viewItem == suspect.withCallSite")));
});

test("no setting holds a secret: the Anthropic key lives in SecretStorage", () => {
  const keys = Object.keys(manifest.contributes.configuration.properties);
  assert.deepEqual(keys.filter((k) => /key|token|secret|anthropic/i.test(k)), []);
});

test("packaging: the .vsix carries dist/ and bundled/ but no sources, tests or node_modules", () => {
  const ignore = fs.readFileSync(path.join(extensionDir, ".vscodeignore"), "utf8").split("\n");
  for (const pattern of ["src/**", "test/**", "node_modules/**", "scripts/**", "python/**"]) {
    assert.ok(ignore.includes(pattern), pattern);
  }
  assert.ok(!ignore.some((l) => l.startsWith("bundled") || l.startsWith("dist")), "bundled/ and dist/ are packaged");
  assert.match(manifest.scripts.package, /vsce package --no-dependencies/);
  assert.match(manifest.scripts.package, /bundle-python/);
});

test("untrusted workspaces: limited support, and a workspace cannot choose what runs (interpreter, host, engine args)", () => {
  const trust = manifest.capabilities?.untrustedWorkspaces;
  assert.ok(trust, "capabilities.untrustedWorkspaces is declared");
  assert.equal(trust.supported, "limited");
  assert.match(trust.description, /Restricted Mode/);
  const props = manifest.contributes.configuration.properties;
  // Every setting that picks a program, a host or arguments the server or its engine process runs with.
  const mustRestrict = ["ekka.interpreter", "ekka.executor", "ekka.remote.python", "ekka.remote.workdir", "ekka.engineArgs"];
  assert.deepEqual([...trust.restrictedConfigurations].sort(), [...mustRestrict].sort());
  for (const key of trust.restrictedConfigurations) {
    assert.ok(key in props, `${key} is a contributed setting`);
  }
});
