// The extension's commands (the ids package.json contributes) and what each one calls.
import * as vscode from "vscode";
import type { Diagnoses } from "./diagnosis";
import type { JobTracker } from "./jobs";
import { SHOW_DIVERGENCE_COMMAND, SHOW_RELEASE_DIFF_COMMAND } from "./protocol";
import type { Reports } from "./reports";
import { clearApiKey, setApiKey } from "./secrets";
import type { EkkaServer } from "./server";
import type { SourceLocation } from "./suspects";
import { OPEN_LOCATION_COMMAND, openLocation } from "./tree";

export const COMMANDS = {
  diagnose: "ekka.diagnose",
  cancel: "ekka.cancel",
  showDivergence: SHOW_DIVERGENCE_COMMAND,
  showReleaseDiff: SHOW_RELEASE_DIFF_COMMAND,
  restartServer: "ekka.restartServer",
  clearResults: "ekka.clearResults",
  showLogs: "ekka.showLogs",
  setApiKey: "ekka.setApiKey",
  clearApiKey: "ekka.clearApiKey",
  openCallSite: "ekka.openCallSite",
  openLocation: OPEN_LOCATION_COMMAND,
} as const;

/** What the command handlers act on. */
export interface CommandTargets {
  server: EkkaServer;
  jobs: JobTracker;
  reports: Reports;
  diagnoses: Diagnoses;
  output: vscode.LogOutputChannel;
  secrets: vscode.SecretStorage | undefined;
}

/** The server gets the API key in its environment at start: a changed key restarts it, unless a job runs. */
async function apiKeyChanged({ server, jobs }: CommandTargets): Promise<void> {
  if (jobs.running !== undefined) {
    void vscode.window.showInformationMessage(
      'Ekka: the key is used from the next server start ("Ekka: Restart Server") — a diagnosis is running now.',
    );
    return;
  }
  await server.restart();
}

/** Registers every command; dispose the result to unregister them. */
export function registerCommands(t: CommandTargets): vscode.Disposable[] {
  const { server, reports, diagnoses, output, secrets } = t;
  return [
    vscode.commands.registerCommand(COMMANDS.diagnose, (uri?: vscode.Uri) => diagnoses.diagnose(uri)),
    vscode.commands.registerCommand(COMMANDS.cancel, (jobId?: string) => diagnoses.cancel(jobId)),
    vscode.commands.registerCommand(COMMANDS.showDivergence, (arg?: unknown) => reports.showDivergence(arg)),
    vscode.commands.registerCommand(COMMANDS.showReleaseDiff, (arg?: unknown) => reports.showReleaseDiff(arg)),
    vscode.commands.registerCommand(COMMANDS.restartServer, () => server.restart()),
    vscode.commands.registerCommand(COMMANDS.clearResults, () => reports.clear(server)),
    vscode.commands.registerCommand(COMMANDS.showLogs, () => output.show()),
    vscode.commands.registerCommand(COMMANDS.setApiKey, async () => {
      if (secrets === undefined) return false;
      const stored = await setApiKey(secrets);
      if (stored) await apiKeyChanged(t);
      return stored;
    }),
    vscode.commands.registerCommand(COMMANDS.clearApiKey, async () => {
      if (secrets === undefined) return false;
      const removed = await clearApiKey(secrets);
      if (removed) await apiKeyChanged(t);
      return removed;
    }),
    vscode.commands.registerCommand(COMMANDS.openCallSite, (arg?: unknown) => reports.openCallSite(arg)),
    vscode.commands.registerCommand(COMMANDS.openLocation, (loc?: SourceLocation) => openLocation(loc)),
  ];
}
