// The Python extension's interpreter, used only when that extension is installed (no extensionDependencies:
// offline and code-server installs do not have it). Minimal typing of its public API (@vscode/python-extension).
import * as vscode from "vscode";

export const PYTHON_EXTENSION_ID = "ms-python.python";

interface PythonApi {
  environments?: {
    getActiveEnvironmentPath(resource?: vscode.Uri): { path: string } | undefined;
    resolveEnvironment(path: string | { path: string }): Promise<{ executable?: { uri?: vscode.Uri } } | undefined>;
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
}

async function api(): Promise<PythonApi | undefined> {
  const ext = vscode.extensions.getExtension<PythonApi>(PYTHON_EXTENSION_ID);
  if (ext === undefined) return undefined;
  try {
    return ext.isActive ? ext.exports : await ext.activate();
  } catch {
    return undefined;
  }
}

/** The Python extension's active interpreter for `resource`, or undefined (not installed, none selected, error). */
export async function pythonExtensionInterpreter(resource: vscode.Uri | undefined): Promise<string | undefined> {
  try {
    const envs = (await api())?.environments;
    if (envs === undefined) return undefined;
    const active = envs.getActiveEnvironmentPath(resource);
    if (active === undefined || !active.path) return undefined;
    const resolved = await envs.resolveEnvironment(active);
    return resolved?.executable?.uri?.fsPath || active.path;
  } catch {
    return undefined;
  }
}

/** Calls `listener` when the user picks another interpreter in the Python extension (if it is installed). */
export async function onDidChangePythonInterpreter(listener: () => void): Promise<vscode.Disposable | undefined> {
  const event = (await api())?.environments?.onDidChangeActiveEnvironmentPath;
  return event === undefined ? undefined : event(() => listener());
}
