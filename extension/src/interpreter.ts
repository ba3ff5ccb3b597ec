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
 * Resolve the interpreter, first match wins:
 *  1. the `ekka.interpreter` setting, trimmed, with `${workspaceFolder}` replaced by the workspace root;
 *  2. `<root>/.venv/bin/python` (`<root>\.venv\Scripts\python.exe` on win32) when `exists` says it is there;
 *  3. `python3`.
 * `exists` and `platform` are parameters so that every branch is testable on any host.
 */
export function resolveInterpreter(
  setting: string | undefined,
  workspaceRoot: string | undefined,
  exists: (p: string) => boolean,
  platform: string,
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
  if (workspaceRoot !== undefined && workspaceRoot !== "") {
    const venv = venvInterpreter(workspaceRoot, platform);
    if (exists(venv)) {
      return venv;
    }
  }
  return FALLBACK_INTERPRETER;
}

/** How the language server process is launched (stdio transport): `<interpreter> -m server`, run in the workspace root. */
export interface ServerLaunch {
  command: string;
  args: string[];
  cwd: string | undefined;
}

export function serverLaunch(interpreter: string, workspaceRoot: string | undefined): ServerLaunch {
  // `python -m server` finds the package through the working directory, so cwd must be the workspace root.
  return { command: interpreter, args: ["-m", SERVER_MODULE], cwd: workspaceRoot || undefined };
}
