// The extension's settings as one typed object per workspace folder (ruff-vscode's getWorkspaceSettings), sent
// to the language server, which resolves the settings of the folder a job's file is in (server/settings.py reads
// exactly this shape). `readSettings` is pure (a configuration getter in, the object out) so that the unit tests
// check every field without VS Code.
import * as vscode from "vscode";

export type Target = "vllm" | "sglang";

/** What the server receives per folder (server/settings.py WorkspaceSettings.from_json). */
export interface WorkspaceSettings {
  /** The folder's path ("" for the global settings). */
  workspace: string;
  /** `ekka.interpreter`, as set (the server resolves it: see interpreter.ts for the shared precedence). */
  interpreter: string;
  /** The Python extension's interpreter for the folder, looked up only when `ekka.interpreter` is empty. */
  pythonInterpreter: string;
  /** `ekka.target.default`: the target of a spec that names none. */
  targetDefault: Target;
  /** `ekka.executor`: "local" or "ssh://host". */
  executor: string;
  remote: { python: string; workdir: string };
  /** `ekka.engineArgs`: engine arguments merged into the spec's engine_args (the spec's own keys win). */
  engineArgs: Record<string, unknown>;
}

/** `initializationOptions` and the `ekka` member of `workspace/didChangeConfiguration`. */
export interface ServerSettings {
  settings: WorkspaceSettings[];
  globalSettings: WorkspaceSettings;
}

export const DEFAULTS = {
  interpreter: "",
  targetDefault: "vllm" as Target,
  executor: "local",
  remotePython: "python3",
  remoteWorkdir: "~/.cache/ekka-remote",
};

/** The part of vscode.WorkspaceConfiguration that readSettings uses. */
export interface ConfigGetter {
  get<T>(key: string, defaultValue?: T): T | undefined;
}

function text(config: ConfigGetter, key: string, fallback: string): string {
  const v = config.get<unknown>(key);
  return typeof v === "string" ? v : fallback;
}

/** Typed settings of one folder from its `ekka` configuration section. Values of the wrong type are passed as
 * they are only for `engineArgs` (the server names a bad one when a job uses it); strings fall back to their
 * defaults. */
export function readSettings(config: ConfigGetter, workspace: string, pythonInterpreter?: string): WorkspaceSettings {
  const target = text(config, "target.default", DEFAULTS.targetDefault);
  const engineArgs = config.get<unknown>("engineArgs");
  return {
    workspace,
    interpreter: text(config, "interpreter", DEFAULTS.interpreter),
    pythonInterpreter: (pythonInterpreter ?? "").trim(),
    targetDefault: target === "sglang" ? "sglang" : "vllm",
    executor: text(config, "executor", DEFAULTS.executor),
    remote: {
      python: text(config, "remote.python", DEFAULTS.remotePython),
      workdir: text(config, "remote.workdir", DEFAULTS.remoteWorkdir),
    },
    engineArgs:
      engineArgs === undefined || engineArgs === null ? {} : (engineArgs as Record<string, unknown>),
  };
}

/** Looks up the Python extension's interpreter for a folder (pythonExtension.ts); injectable for tests. */
export type PythonInterpreterLookup = (resource: vscode.Uri | undefined) => Promise<string | undefined>;

/** The settings of one workspace folder (resource-scoped settings resolved for that folder). */
export async function getWorkspaceSettings(
  folder: vscode.WorkspaceFolder,
  pythonInterpreter: PythonInterpreterLookup,
): Promise<WorkspaceSettings> {
  const config = vscode.workspace.getConfiguration("ekka", folder.uri);
  const setting = text(config, "interpreter", "");
  const fromPython = setting.trim() === "" ? await pythonInterpreter(folder.uri) : undefined;
  return readSettings(config, folder.uri.fsPath, fromPython);
}

/** The settings outside any folder (user and workspace level). */
export async function getGlobalSettings(pythonInterpreter: PythonInterpreterLookup): Promise<WorkspaceSettings> {
  const config = vscode.workspace.getConfiguration("ekka");
  const setting = text(config, "interpreter", "");
  const fromPython = setting.trim() === "" ? await pythonInterpreter(undefined) : undefined;
  return readSettings(config, "", fromPython);
}

/** Every folder's settings and the global ones, as the server takes them. */
export async function getServerSettings(pythonInterpreter: PythonInterpreterLookup): Promise<ServerSettings> {
  const folders = vscode.workspace.workspaceFolders ?? [];
  return {
    settings: await Promise.all(folders.map((f) => getWorkspaceSettings(f, pythonInterpreter))),
    globalSettings: await getGlobalSettings(pythonInterpreter),
  };
}
