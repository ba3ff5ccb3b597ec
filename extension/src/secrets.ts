// The Anthropic API key (for the mapping agent) lives in VS Code's SecretStorage, never in settings.json. The
// server gets it as ANTHROPIC_API_KEY in its environment (the worker inherits it; ekka_core.agent reads it).
import * as vscode from "vscode";

export const SECRET_KEY = "ekka.anthropicApiKey";
export const ENV_VAR = "ANTHROPIC_API_KEY";

/** What an entered key must look like (trimmed): non-empty, no whitespace inside. */
export function validateApiKey(value: string): string | undefined {
  const v = value.trim();
  if (v === "") return "Enter a key, or press Escape to cancel.";
  if (/\s/.test(v)) return "An API key has no spaces or line breaks.";
  return undefined;
}

/** The environment the server starts with: the stored key, if any, replaces an inherited one. */
export function serverEnv(base: NodeJS.ProcessEnv, apiKey: string | undefined): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...base, PYTHONUNBUFFERED: "1" };
  if (apiKey !== undefined && apiKey !== "") env[ENV_VAR] = apiKey;
  return env;
}

/**
 * "Ekka: Set Anthropic API key": asks for the key (password box) and stores it. Resolves to true when a key was
 * stored (the caller restarts the server so that it gets the key).
 */
export async function setApiKey(secrets: vscode.SecretStorage): Promise<boolean> {
  const value = await vscode.window.showInputBox({
    title: "Ekka: Anthropic API key",
    prompt: "Used by Ekka's mapping agent for components its rules cannot map. Stored in VS Code's secret storage.",
    placeHolder: "sk-ant-…",
    password: true,
    ignoreFocusOut: true,
    validateInput: validateApiKey,
  });
  if (value === undefined || validateApiKey(value) !== undefined) return false;
  await secrets.store(SECRET_KEY, value.trim());
  void vscode.window.showInformationMessage("Ekka: Anthropic API key stored in the secret storage.");
  return true;
}

/** "Ekka: Clear Anthropic API key". Resolves to true when a stored key was deleted. */
export async function clearApiKey(secrets: vscode.SecretStorage): Promise<boolean> {
  const had = (await secrets.get(SECRET_KEY)) !== undefined;
  await secrets.delete(SECRET_KEY);
  void vscode.window.showInformationMessage(
    had ? "Ekka: Anthropic API key removed from the secret storage." : "Ekka: no Anthropic API key was stored.",
  );
  return had;
}
