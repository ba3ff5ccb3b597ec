// "Ekka: Set Anthropic API key": SecretStorage only, handed to the server as ANTHROPIC_API_KEY.
import assert from "node:assert/strict";
import { beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import { MockSecretStorage, mock, resetVscodeMock, vscodeModule } from "./mocks/vscode";

installModuleMocks({ vscode: vscodeModule });
const secrets: typeof import("../src/secrets") = require("../src/secrets");

beforeEach(() => resetVscodeMock());

describe("setApiKey", () => {
  test("asks with a password box and stores the trimmed key under ekka.anthropicApiKey", async () => {
    const store = new MockSecretStorage();
    mock.inputBoxAnswer = "  sk-ant-test-123 ";
    assert.equal(await secrets.setApiKey(store as never), true);
    assert.equal(store.values.get("ekka.anthropicApiKey"), "sk-ant-test-123");
    assert.equal(mock.inputBoxes.length, 1);
    assert.equal(mock.inputBoxes[0].password, true);
    assert.equal(mock.inputBoxes[0].ignoreFocusOut, true);
    assert.equal(mock.messages.at(-1)?.level, "info");
    assert.doesNotMatch(mock.messages.at(-1)!.text, /sk-ant/, "the key is never shown");
  });

  test("Escape stores nothing", async () => {
    const store = new MockSecretStorage();
    mock.inputBoxAnswer = undefined;
    assert.equal(await secrets.setApiKey(store as never), false);
    assert.equal(store.values.size, 0);
  });

  test("the input is validated", () => {
    assert.match(secrets.validateApiKey("  ")!, /Enter a key/);
    assert.match(secrets.validateApiKey("sk ant")!, /no spaces/);
    assert.equal(secrets.validateApiKey("sk-ant-1"), undefined);
  });

  test("clearApiKey deletes it", async () => {
    const store = new MockSecretStorage();
    await store.store("ekka.anthropicApiKey", "k");
    assert.equal(await secrets.clearApiKey(store as never), true);
    assert.equal(store.values.size, 0);
    assert.equal(await secrets.clearApiKey(store as never), false);
  });
});

describe("serverEnv", () => {
  test("the stored key becomes ANTHROPIC_API_KEY; without one the inherited environment is kept", () => {
    assert.equal(secrets.serverEnv({ PATH: "/bin" }, "sk-1").ANTHROPIC_API_KEY, "sk-1");
    assert.equal(secrets.serverEnv({ ANTHROPIC_API_KEY: "from-shell" }, "sk-1").ANTHROPIC_API_KEY, "sk-1");
    assert.equal(secrets.serverEnv({ ANTHROPIC_API_KEY: "from-shell" }, undefined).ANTHROPIC_API_KEY, "from-shell");
    assert.equal(secrets.serverEnv({}, undefined).ANTHROPIC_API_KEY, undefined);
    assert.equal(secrets.serverEnv({}, undefined).PYTHONUNBUFFERED, "1");
  });
});
