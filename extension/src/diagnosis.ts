// "Ekka: Diagnose silent error" and "Ekka: Cancel diagnosis": ask the server to start (`ekka.server.diagnose`) or
// cancel (`ekka.server.cancel`) a job, follow it with the progress notification (jobs.ts followJob), and reveal
// the Silent errors view when it is done.
import * as vscode from "vscode";
import { baseName, errorText, isDiagnosableFile } from "./format";
import { type JobTracker, followJob } from "./jobs";
import {
  type DiagnoseArgs,
  type JobState,
  REQUEST_FAILED,
  SERVER_CANCEL_COMMAND,
  SERVER_DIAGNOSE_COMMAND,
} from "./protocol";
import type { Reports } from "./reports";
import type { EkkaServer } from "./server";
import { SUSPECTS_VIEW } from "./tree";

/** EKKA_* variables of the extension host's environment that are forwarded to the engine (tests and benchmarks:
 * re-inject a known bug so that a demo spec reproduces it; see server/protocol.py, `env`). */
export const FORWARDED_ENV = ["EKKA_INJECT_BUG"] as const;

/** The FORWARDED_ENV variables set in `env` (undefined when none is). Pure. */
export function engineEnv(env: NodeJS.ProcessEnv): Record<string, string> | undefined {
  const forwarded: Record<string, string> = {};
  for (const name of FORWARDED_ENV) {
    const v = env[name];
    if (v) forwarded[name] = v;
  }
  return Object.keys(forwarded).length ? forwarded : undefined;
}

/** The job id in the server's answer to `ekka.server.diagnose` (`{jobId}`, or a bare string). */
function jobIdOf(result: unknown): string | undefined {
  if (typeof result === "object" && result !== null && typeof (result as { jobId?: unknown }).jobId === "string") {
    return (result as { jobId: string }).jobId;
  }
  return typeof result === "string" ? result : undefined;
}

export class Diagnoses {
  constructor(
    private readonly server: EkkaServer,
    private readonly jobs: JobTracker,
    private readonly reports: Reports,
    private readonly output: vscode.LogOutputChannel,
  ) {}

  /** Starts a diagnosis of a spec or repro script; resolves with its job id once the server accepted it. */
  async diagnose(resource?: vscode.Uri): Promise<string | undefined> {
    const uri = resource instanceof vscode.Uri ? resource : vscode.window.activeTextEditor?.document.uri;
    if (uri === undefined || !isDiagnosableFile(uri.fsPath || uri.path)) {
      void vscode.window.showWarningMessage("Ekka: open a Python repro script or a *.ekka.toml spec to diagnose.");
      return undefined;
    }
    if (!this.server.running) {
      this.output.error(`Cannot diagnose ${uri.toString()}: the Ekka server is not running.`);
      void vscode.window.showErrorMessage('Ekka: the language server is not running. See the "Ekka" output.');
      return undefined;
    }
    const args: DiagnoseArgs = { uri: uri.toString() };
    const env = engineEnv(process.env);
    if (env !== undefined) {
      args.env = env;
      this.output.info(`Forwarding ${Object.keys(env).join(", ")} to the engine.`);
    }
    let result: unknown;
    try {
      result = await this.server.executeCommand(SERVER_DIAGNOSE_COMMAND, [args]);
    } catch (err) {
      const e = err as { code?: number; data?: { jobId?: string } };
      if (e?.code === REQUEST_FAILED && typeof e.data?.jobId === "string") {
        const running = e.data.jobId;
        const choice = await vscode.window.showWarningMessage(
          `Ekka: a diagnosis is already running (job ${running}).`,
          "Cancel it",
        );
        if (choice === "Cancel it") await this.cancel(running);
        return undefined;
      }
      this.output.error(`Diagnosis of ${uri.toString()} failed to start: ${errorText(err)}`);
      void vscode.window.showErrorMessage(`Ekka: diagnosis failed to start: ${errorText(err)}`);
      return undefined;
    }
    const jobId = jobIdOf(result);
    if (jobId === undefined) {
      this.output.error(`Diagnosis of ${uri.toString()}: unexpected answer from the server: ${JSON.stringify(result)}`);
      void vscode.window.showErrorMessage("Ekka: the server did not return a job id (see the Ekka output).");
      return undefined;
    }
    this.output.info(`Diagnosis of ${uri.toString()} started (job ${jobId}).`);
    if (this.jobs.get(jobId) === undefined) {
      this.jobs.update({ jobId, state: "queued", stage: null, uri: uri.toString() });
    }
    void followJob(this.jobs, jobId, `Ekka: diagnosing ${baseName(uri.fsPath || uri.path)}`, (id) => this.cancel(id)).then(
      (final) => this.onJobFinished(final),
    );
    return jobId;
  }

  private onJobFinished(job: JobState): void {
    this.output.info(`Job ${job.jobId} ${job.state}${job.message ? `: ${job.message}` : ""}`);
    if (job.state === "done" && this.reports.get(job.jobId) !== undefined) {
      void vscode.commands.executeCommand(`${SUSPECTS_VIEW}.focus`).then(undefined, () => undefined);
    } else if (job.state === "failed" && !this.server.running) {
      // The server reports its own failures (window/showMessage); a server that went away cannot.
      void vscode.window.showErrorMessage(`Ekka: ${job.message ?? "the diagnosis failed"}`);
    }
  }

  /** Cancels a job (default: the running one). */
  async cancel(jobId?: string): Promise<void> {
    const id = typeof jobId === "string" ? jobId : this.jobs.running?.jobId;
    if (id === undefined) {
      void vscode.window.showInformationMessage("Ekka: no diagnosis is running.");
      return;
    }
    this.output.info(`Cancelling job ${id}.`);
    try {
      const record = (await this.server.executeCommand(SERVER_CANCEL_COMMAND, [{ jobId: id }])) as JobState | null;
      if (record && typeof record.jobId === "string") this.jobs.update(record);
    } catch (err) {
      this.output.error(`Cancelling job ${id}: ${errorText(err)}`);
    }
  }
}
