import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, test } from "node:test";
import {
  FALLBACK_INTERPRETER,
  resolveInterpreter,
  serverLaunch,
  venvInterpreter,
} from "../src/interpreter";

const nothingExists = (_p: string) => false;
const everythingExists = (_p: string) => true;

describe("resolveInterpreter", () => {
  test("the setting wins over an existing .venv", () => {
    const checked: string[] = [];
    const got = resolveInterpreter("/opt/py/bin/python3.12", "/ws", (p) => (checked.push(p), true), "linux");
    assert.equal(got, "/opt/py/bin/python3.12");
    assert.deepEqual(checked, [], "the .venv is not even looked at when the setting is given");
  });

  test("the setting is trimmed", () => {
    assert.equal(resolveInterpreter("  /usr/bin/python3 \n", "/ws", everythingExists, "linux"), "/usr/bin/python3");
  });

  test("${workspaceFolder} in the setting is replaced by the workspace root (every occurrence)", () => {
    assert.equal(
      resolveInterpreter("${workspaceFolder}/env/bin/python", "/home/me/proj", nothingExists, "linux"),
      "/home/me/proj/env/bin/python",
    );
    assert.equal(
      resolveInterpreter("${workspaceFolder}/a:${workspaceFolder}/b", "/r", nothingExists, "linux"),
      "/r/a:/r/b",
    );
  });

  test("${workspaceFolder} without a workspace is an error that names the setting", () => {
    assert.throws(
      () => resolveInterpreter("${workspaceFolder}/.venv/bin/python", undefined, everythingExists, "linux"),
      /ekka\.interpreter/,
    );
  });

  for (const blank of [undefined, "", "   "]) {
    test(`a ${JSON.stringify(blank)} setting falls through to the workspace .venv (posix)`, () => {
      const checked: string[] = [];
      const got = resolveInterpreter(blank, "/home/me/proj", (p) => (checked.push(p), true), "linux");
      assert.equal(got, "/home/me/proj/.venv/bin/python");
      assert.deepEqual(checked, ["/home/me/proj/.venv/bin/python"]);
    });
  }

  test("darwin uses the posix .venv layout", () => {
    assert.equal(resolveInterpreter("", "/Users/me/p", everythingExists, "darwin"), "/Users/me/p/.venv/bin/python");
  });

  test("win32 uses .venv\\Scripts\\python.exe", () => {
    const checked: string[] = [];
    const got = resolveInterpreter(undefined, "C:\\work\\proj", (p) => (checked.push(p), true), "win32");
    assert.equal(got, "C:\\work\\proj\\.venv\\Scripts\\python.exe");
    assert.deepEqual(checked, ["C:\\work\\proj\\.venv\\Scripts\\python.exe"]);
  });

  test("win32 without a .venv falls back to python3", () => {
    assert.equal(resolveInterpreter(undefined, "C:\\work\\proj", nothingExists, "win32"), FALLBACK_INTERPRETER);
  });

  test("no .venv in the workspace: python3", () => {
    assert.equal(resolveInterpreter(undefined, "/ws", nothingExists, "linux"), "python3");
  });

  test("no workspace at all: python3, without touching the file system", () => {
    for (const root of [undefined, ""]) {
      const checked: string[] = [];
      assert.equal(resolveInterpreter("", root, (p) => (checked.push(p), true), "linux"), "python3");
      assert.deepEqual(checked, []);
    }
  });

  test("venvInterpreter normalises a trailing separator", () => {
    assert.equal(venvInterpreter("/ws/", "linux"), "/ws/.venv/bin/python");
    assert.equal(venvInterpreter("D:\\ws\\", "win32"), "D:\\ws\\.venv\\Scripts\\python.exe");
  });
});

describe("resolveInterpreter with the Python extension", () => {
  test("the setting still wins over the Python extension's interpreter", () => {
    assert.equal(resolveInterpreter("/opt/py", "/ws", everythingExists, "linux", "/conda/bin/python"), "/opt/py");
  });

  test("without a setting, the Python extension's interpreter comes before the workspace .venv", () => {
    const checked: string[] = [];
    const got = resolveInterpreter("", "/ws", (p) => (checked.push(p), true), "linux", " /conda/bin/python ");
    assert.equal(got, "/conda/bin/python");
    assert.deepEqual(checked, []);
  });

  test("a blank answer from the Python extension falls through to the .venv", () => {
    assert.equal(resolveInterpreter(undefined, "/ws", everythingExists, "linux", ""), "/ws/.venv/bin/python");
  });
});

describe("serverLaunch", () => {
  test("runs `<interpreter> -m server` in the workspace root", () => {
    assert.deepEqual(serverLaunch("/ws/.venv/bin/python", "/ws"), {
      command: "/ws/.venv/bin/python",
      args: ["-m", "server"],
      cwd: "/ws",
      source: "workspace",
    });
  });

  test("with the bundled server: `<interpreter> <extension>/bundled/tool/lsp_server.py` in the workspace root", () => {
    assert.deepEqual(serverLaunch("/usr/bin/python3", "/ws", "/ext/bundled/tool/lsp_server.py"), {
      command: "/usr/bin/python3",
      args: ["/ext/bundled/tool/lsp_server.py"],
      cwd: "/ws",
      source: "bundled",
    });
    assert.equal(serverLaunch("python3", "/ws", "").source, "workspace", "an empty entry is no bundle");
  });

  test("no workspace: no cwd", () => {
    assert.equal(serverLaunch("python3", undefined).cwd, undefined);
    assert.equal(serverLaunch("python3", "").cwd, undefined);
  });
});

// The same cases as tests/server/test_settings.py runs against server/settings.py: one precedence in both.
interface PrecedenceCase {
  name: string;
  setting: string;
  python_extension: string;
  root: string;
  venv_exists: boolean;
  platform: string;
  expect?: string;
  expect_fallback?: boolean;
  error?: string;
}
const precedence: { cases: PrecedenceCase[] } = JSON.parse(
  fs.readFileSync(path.join(__dirname, "..", "test", "fixtures", "interpreter-precedence.json"), "utf8"),
);

describe("interpreter precedence shared with the server (fixtures/interpreter-precedence.json)", () => {
  test("the table has every branch", () => {
    assert.ok(precedence.cases.length >= 8);
    assert.ok(precedence.cases.some((c) => c.error !== undefined));
    assert.ok(precedence.cases.some((c) => c.expect_fallback));
  });
  for (const c of precedence.cases) {
    test(c.name, () => {
      const run = () =>
        resolveInterpreter(c.setting, c.root || undefined, () => c.venv_exists, c.platform, c.python_extension);
      if (c.error !== undefined) {
        assert.throws(run, new RegExp(c.error.replace(/\./g, "\\.")));
      } else {
        assert.equal(run(), c.expect_fallback ? FALLBACK_INTERPRETER : c.expect);
      }
    });
  }
});
