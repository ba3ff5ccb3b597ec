// Which Python runs the Ekka language server. Pure: no 'vscode' import, so it is unit-tested in plain Node.
import * as path from "node:path";

/** Module run with `<interpreter> -m <module>`: the `server/` package at the workspace root (see DESIGN.md, Layout). */
export const SERVER_MODULE = "server";

/** Interpreter used when neither the setting nor a workspace `.venv` gives one. */
export const FALLBACK_INTERPRETER = "python3";

/** Path of the interpreter inside `<root>/.venv` for the given platform (`process.platform` values). */
export function venvInterpreter(workspaceRoot: string, platform: string): string {
  return platform === "win32"
    ? path.win32.join(workspaceRoot, ".venv", "Scripts", "python.exe")
    : path.posix.join(workspaceRoot, ".venv", "bin", "python");
}

/**
 * Resolve the interpreter, first match wins — the one precedence Ekka uses, here for the language server and in
 * server/settings.py (resolve_interpreter) for each job's engine process; both run the cases of
 * test/fixtures/interpreter-precedence.json:
 *  1. the `ekka.interpreter` setting, trimmed, with `${workspaceFolder}` replaced by the folder (an error without
 *     one);
 *  2. the Python extension's active interpreter for the folder (`fromPythonExtension`, trimmed), when that
 *     extension is installed and has one (there is no hard dependency on it);
 *  3. `<root>/.venv/bin/python` (`<root>\.venv\Scripts\python.exe` on win32) when `exists` says it is there;
 *  4. the fallback: `python3` here (the server: the interpreter it runs with).
 * `exists` and `platform` are parameters so that every branch is testable on any host.
 */
export function resolveInterpreter(
  setting: string | undefined,
  workspaceRoot: string | undefined,
  exists: (p: string) => boolean,
  platform: string,
  fromPythonExtension?: string,
): string {
  const configured = (setting ?? "").trim();
  if (configured !== "") {
    if (configured.includes("${workspaceFolder}")) {
      if (workspaceRoot === undefined || workspaceRoot === "") {
        throw new Error(`ekka.interpreter uses \${workspaceFolder} ("${configured}") but no workspace folder is open`);
      }
      return configured.split("${workspaceFolder}").join(workspaceRoot);
    }
    return configured;
  }
  const fromExtension = (fromPythonExtension ?? "").trim();
  if (fromExtension !== "") {
    return fromExtension;
  }
  if (workspaceRoot !== undefined && workspaceRoot !== "") {
    const venv = venvInterpreter(workspaceRoot, platform);
    if (exists(venv)) {
      return venv;
    }
  }
  return FALLBACK_INTERPRETER;
}

/** Entry script of the server bundled in the .vsix, relative to the extension folder (scripts/bundle_python.py). */
export const BUNDLED_ENTRY = ["bundled", "tool", "lsp_server.py"] as const;

/** How the language server process is launched (stdio transport), run in the workspace root. */
export interface ServerLaunch {
  command: string;
  args: string[];
  cwd: string | undefined;
  /** "bundled": the server shipped in the extension; "workspace": `-m server` from the workspace (development). */
  source: "bundled" | "workspace";
}

/**
 * `<interpreter> <extension>/bundled/tool/lsp_server.py` when the extension carries the bundled server (a
 * packaged .vsix: the server and its pure-Python dependencies, run by the user's interpreter); otherwise
 * `<interpreter> -m server` in the workspace root (developing Ekka itself: the `server/` package at the root).
 */
export function serverLaunch(interpreter: string, workspaceRoot: string | undefined, bundledEntry?: string): ServerLaunch {
  const cwd = workspaceRoot || undefined;
  if (bundledEntry !== undefined && bundledEntry !== "") {
    return { command: interpreter, args: [bundledEntry], cwd, source: "bundled" };
  }
  // `python -m server` finds the package through the working directory, so cwd must be the workspace root.
  return { command: interpreter, args: ["-m", SERVER_MODULE], cwd, source: "workspace" };
}
