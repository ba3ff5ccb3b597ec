// The Ekka status bar item: the language server's state while it starts or is down, else the latest job's state
// and its report's top suspect (jobs.ts statusFor). A click diagnoses the current file, or, once there is a report,
// reveals the "Silent errors" view.
import * as vscode from "vscode";
import { COMMANDS } from "./commands";
import { summarizeReport } from "./format";
import { type JobTracker, statusFor } from "./jobs";
import type { Reports } from "./reports";
import type { ServerState, ServerStatus } from "./server";
import { SUSPECTS_VIEW } from "./tree";

/** Text and tooltip per server state; "running" shows the jobs instead. */
const SERVER_STATES: Record<Exclude<ServerState, "running">, { text: string; tooltip: string }> = {
  starting: { text: "$(sync~spin) Ekka", tooltip: "Ekka: starting the language server" },
  failed: { text: "$(warning) Ekka", tooltip: "Ekka: the language server is not running (see the Ekka output)" },
  closed: { text: "$(warning) Ekka", tooltip: "Ekka: the language server stopped (see the Ekka output)" },
  untrusted: {
    text: "$(shield) Ekka",
    tooltip: "Ekka: Restricted Mode — the language server starts once you trust this workspace",
  },
};

export class StatusBar implements ServerStatus, vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
  private readonly subscriptions: vscode.Disposable[];

  constructor(
    private readonly jobs: JobTracker,
    private readonly reports: Reports,
  ) {
    this.item.name = "Ekka";
    this.item.command = COMMANDS.diagnose;
    this.item.text = "$(beaker) Ekka";
    this.item.show();
    this.subscriptions = [jobs.onDidChange(() => this.refresh()), reports.onDidChange(() => this.refresh())];
  }

  /** Shows the latest job and its report's summary; sets the `ekka.jobRunning` context the menus use. */
  refresh(): void {
    const job = this.jobs.latest;
    const report = job === undefined ? undefined : this.reports.get(job.jobId);
    const { text, tooltip } = statusFor(job, report ? summarizeReport(report) : undefined);
    const inconclusive = job?.state === "done" && (report?.report.verdict ?? job.verdict) === "inconclusive";
    // An inconclusive diagnosis has not looked: a warning, not a bug, and the tooltip says what it could not see
    // (the server's "Not observed" section, as it came).
    this.item.text = inconclusive ? text.replace(/^\$\([^)]*\)/, "$(warning)") : text;
    const missing = inconclusive ? report?.coverage?.find((s) => s.key === "missing") : undefined;
    this.item.tooltip = missing
      ? [tooltip, `${missing.title}:`, ...missing.items.map((i) => `• ${i.label ? `${i.label}: ` : ""}${i.text}`)].join("\n")
      : tooltip;
    this.item.command = this.reports.latest !== undefined ? `${SUSPECTS_VIEW}.focus` : COMMANDS.diagnose;
    void vscode.commands.executeCommand("setContext", "ekka.jobRunning", this.jobs.running !== undefined);
  }

  serverState(state: ServerState): void {
    if (state === "running") {
      this.refresh();
      return;
    }
    const { text, tooltip } = SERVER_STATES[state];
    this.item.text = text;
    this.item.tooltip = tooltip;
  }

  dispose(): void {
    for (const d of this.subscriptions) d.dispose();
    this.item.dispose();
  }
}
