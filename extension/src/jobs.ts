// Diagnosis jobs as the client sees them: the latest `ekka/jobState` of each job, and the notification with a
// Cancel button that follows one job from its start to its end.
import * as vscode from "vscode";
import { type JobState, isFinal } from "./protocol";

/** Status bar text and tooltip for the latest job (undefined: no job yet); a done job shows `summary` (its report's,
 * format.ts summarizeReport), else the server's message for it (the report's headline). Pure. */
export function statusFor(job: JobState | undefined, summary?: string): { text: string; tooltip: string } {
  if (job === undefined) {
    return { text: "$(beaker) Ekka", tooltip: "Ekka: ready. Click to diagnose the current file." };
  }
  switch (job.state) {
    case "queued":
      return { text: "$(sync~spin) Ekka: starting", tooltip: `Ekka: job ${job.jobId} is starting` };
    case "running": {
      const pct = typeof job.percent === "number" ? ` ${job.percent}%` : "";
      const stage = job.stage ?? "starting";
      return {
        text: `$(sync~spin) Ekka: ${stage}${pct}`,
        tooltip: `Ekka: job ${job.jobId} — ${stage}${job.message ? `: ${job.message}` : ""}`,
      };
    }
    case "done":
      return {
        text: `${job.verdict === "consistent" ? "$(check)" : "$(bug)"} Ekka: ${summary ?? job.message ?? job.verdict ?? "done"}`,
        tooltip: `Ekka: job ${job.jobId} finished${job.message ? ` — ${job.message}` : ""}. Click to see the suspects.`,
      };
    case "failed":
      return {
        text: "$(error) Ekka: failed",
        tooltip: `Ekka: job ${job.jobId} failed — ${job.error?.message ?? job.message ?? "see the Ekka output"}`,
      };
    case "cancelled":
      return { text: "$(circle-slash) Ekka: cancelled", tooltip: `Ekka: job ${job.jobId} was cancelled` };
    default:
      return { text: "$(beaker) Ekka", tooltip: `Ekka: job ${job.jobId}: ${String(job.state)}` };
  }
}

/** The progress notification's message for a job state. Pure. */
export function progressMessage(job: JobState): string {
  if (job.state === "queued") return "starting the worker";
  const stage = job.stage ? `${job.stage}` : "";
  const msg = job.message ?? "";
  return stage && msg ? `${stage}: ${msg}` : stage || msg;
}

/** Latest state per job, and who waits for which job. */
export class JobTracker implements vscode.Disposable {
  private readonly states = new Map<string, JobState>();
  private readonly emitter = new vscode.EventEmitter<JobState>();
  readonly onDidChange = this.emitter.event;
  private latestId: string | undefined;

  update(job: JobState): void {
    if (typeof job?.jobId !== "string") return;
    this.states.set(job.jobId, job);
    this.latestId = job.jobId;
    this.emitter.fire(job);
  }

  get(jobId: string): JobState | undefined {
    return this.states.get(jobId);
  }

  get latest(): JobState | undefined {
    return this.latestId === undefined ? undefined : this.states.get(this.latestId);
  }

  /** The job that is queued or running, if any. */
  get running(): JobState | undefined {
    return [...this.states.values()].reverse().find((j) => !isFinal(j.state));
  }

  /** Resolves with the job's final state (at once if it already has one). */
  whenFinal(jobId: string): Promise<JobState> {
    const known = this.states.get(jobId);
    if (known !== undefined && isFinal(known.state)) return Promise.resolve(known);
    return new Promise((resolve) => {
      const sub = this.onDidChange((j) => {
        if (j.jobId === jobId && isFinal(j.state)) {
          sub.dispose();
          resolve(j);
        }
      });
    });
  }

  /** The server went away: every job it was running is over (so no progress notification waits forever). */
  failRunning(message: string): void {
    for (const j of [...this.states.values()]) {
      if (!isFinal(j.state)) {
        this.update({ ...j, state: "failed", message, error: { message, fix: null, exit_code: 3 } });
      }
    }
  }

  clear(): void {
    this.states.clear();
    this.latestId = undefined;
  }

  dispose(): void {
    this.emitter.dispose();
  }
}

/**
 * Shows a notification with a Cancel button while the job runs: its message follows `ekka/jobState` (stage and
 * percentage), Cancel calls `cancel(jobId)` (the extension sends `ekka.server.cancel {jobId}`), and the
 * notification closes when the job reaches a final state. Resolves with that state.
 */
export function followJob(
  tracker: JobTracker,
  jobId: string,
  title: string,
  cancel: (jobId: string) => Promise<unknown>,
): Thenable<JobState> {
  return vscode.window.withProgress(
    { location: vscode.ProgressLocation.Notification, title, cancellable: true },
    async (progress, token) => {
      let shown = 0;
      const report = (j: JobState) => {
        if (j.jobId !== jobId) return;
        const pct = typeof j.percent === "number" ? Math.max(0, Math.min(100, j.percent)) : shown;
        const increment = pct > shown ? pct - shown : undefined;
        shown = Math.max(shown, pct);
        progress.report({ message: progressMessage(j), increment });
      };
      const sub = tracker.onDidChange(report);
      const known = tracker.get(jobId);
      if (known !== undefined) report(known);
      const cancelSub = token.onCancellationRequested(() => {
        progress.report({ message: "cancelling…" });
        cancel(jobId).catch(() => undefined);
      });
      try {
        return await tracker.whenFinal(jobId);
      } finally {
        sub.dispose();
        cancelSub.dispose();
      }
    },
  );
}
