// Thin client (ruff-vscode style): activation wires the pieces together, each in its own module — the language
// server's lifecycle (server.ts), the commands (commands.ts), diagnoses and their jobs (diagnosis.ts, jobs.ts), the
// reports with the "Silent errors" view and the webviews (reports.ts, tree.ts, webview.ts) and the status bar
// (status.ts). The work happens in the Python server; the pure logic (interpreter, format, suspects, plot) is
// unit-tested without VS Code.
import * as vscode from "vscode";
import { registerCommands } from "./commands";
import { Diagnoses } from "./diagnosis";
import { errorText } from "./format";
import { JobTracker } from "./jobs";
import { Reports } from "./reports";
import { EkkaServer, watchServer } from "./server";
import { StatusBar } from "./status";

export { COMMANDS } from "./commands";
export { FORWARDED_ENV } from "./diagnosis";
export { noServerProgressFeature } from "./server";
export { SUSPECTS_VIEW } from "./tree";

/** What activate() returns (the extension's API); the tests use it to wait for the first server start. */
export interface EkkaApi {
  /** Resolves to true once the server has started, false if it could not start (or the workspace is not trusted
   * yet: it starts when trust is granted). Never rejects. */
  serverReady: Promise<boolean>;
}

let current: EkkaServer | undefined;

export function activate(context: vscode.ExtensionContext): EkkaApi {
  const output = vscode.window.createOutputChannel("Ekka", { log: true });
  const jobs = new JobTracker();
  const reports = new Reports(output);
  const status = new StatusBar(jobs, reports);
  const server = new EkkaServer(context, output, status, {
    onReport: (update) => reports.onReport(update),
    onJobState: (job) => jobs.update(job),
    onGone: (why) => jobs.failRunning(why),
  });
  current = server;
  const diagnoses = new Diagnoses(server, jobs, reports, output);

  context.subscriptions.push(
    output,
    status,
    server,
    jobs,
    reports,
    ...registerCommands({ server, jobs, reports, diagnoses, output, secrets: context.secrets }),
  );
  watchServer(server, output, context.subscriptions);

  // Not awaited: activation must not wait for (or fail with) the Python server.
  const serverReady = server.start().catch((err: unknown) => {
    output.error(`Unexpected error while starting the Ekka server: ${errorText(err)}`);
    return false;
  });
  return { serverReady };
}

export async function deactivate(): Promise<void> {
  const server = current;
  current = undefined;
  await server?.stop();
}
