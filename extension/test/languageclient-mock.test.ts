// Keeps test/mocks/languageclient.ts honest: the enum values the extension passes, and the client methods it
// calls, must match the real vscode-languageclient/node. The real module is loaded with a catch-all 'vscode'
// stub (it only needs the module to exist at load time).
import assert from "node:assert/strict";
import { test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import * as mockLc from "./mocks/languageclient";

const anything: ProxyHandler<object> = {
  get(target: Record<PropertyKey, unknown>, prop) {
    if (!(prop in target)) target[prop] = new Proxy(function () {}, anything);
    return target[prop];
  },
};
installModuleMocks({ vscode: new Proxy({}, anything) });
const real: Record<string, unknown> = require("vscode-languageclient/node");

for (const name of ["TransportKind", "RevealOutputChannelOn", "CloseAction", "ErrorAction"] as const) {
  test(`${name} has the real values`, () => {
    const realEnum = real[name] as Record<string, unknown>;
    const mockEnum = mockLc[name] as unknown as Record<string, unknown>;
    for (const key of Object.keys(mockEnum).filter((k) => Number.isNaN(Number(k)))) {
      assert.equal(mockEnum[key], realEnum[key], `${name}.${key}`);
    }
  });
}

test("LanguageClient has the members the extension uses", () => {
  const proto = (real.LanguageClient as { prototype: object }).prototype;
  for (const member of ["start", "stop", "dispose", "onNotification", "sendRequest", "sendNotification", "diagnostics",
                        "registerFeature"]) {
    assert.ok(member in proto, `LanguageClient.prototype.${member}`);
  }
});
