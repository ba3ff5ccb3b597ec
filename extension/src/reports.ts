// The reports the server sent (`ekka/reportUpdated`): the last few by job and the latest one, shown in the "Silent
// errors" view (tree.ts), the divergence and release-diff panels (webview.ts) and the status bar; and the commands
// that open what a report points at (Show divergence, Show release diff, Open call site) or clear the results.
import * as vscode from "vscode";
import { summarizeReport } from "./format";
import type { ReportUpdated, Suspect } from "./protocol";
import type { EkkaServer } from "./server";
import { type SuspectNode, callSiteLocation, classLocation, findSuspect } from "./suspects";
import { SUSPECTS_VIEW, SuspectTreeProvider, openLocation } from "./tree";
import { DivergencePanel, ReleaseDiffPanel } from "./webview";

/** How many reports are kept (by job) for code lenses that name an older job. */
const KEPT_REPORTS = 10;

export class Reports implements vscode.Disposable {
  private readonly byJob = new Map<string, ReportUpdated>();
  private latestReport: ReportUpdated | undefined;
  private readonly emitter = new vscode.EventEmitter<void>();
  /** A report arrived, or the results were cleared while the server runs. */
  readonly onDidChange = this.emitter.event;
  readonly tree = new SuspectTreeProvider();
  readonly treeView: vscode.TreeView<SuspectNode>;
  readonly panel = new DivergencePanel();
  readonly diffPanel = new ReleaseDiffPanel();

  constructor(private readonly output: vscode.LogOutputChannel) {
    this.treeView = vscode.window.createTreeView(SUSPECTS_VIEW, { treeDataProvider: this.tree, showCollapseAll: true });
  }

  /** The latest report, if any. */
  get latest(): ReportUpdated | undefined {
    return this.latestReport;
  }

  get(jobId: string): ReportUpdated | undefined {
    return this.byJob.get(jobId);
  }

  onReport(update: ReportUpdated): void {
    if (typeof update?.jobId !== "string" || update.report === undefined) return;
    this.byJob.set(update.jobId, update);
    while (this.byJob.size > KEPT_REPORTS) this.byJob.delete(this.byJob.keys().next().value as string);
    this.latestReport = update;
    this.tree.setReport(update);
    this.treeView.message = this.tree.message;
    const n = update.report.suspects?.length ?? 0;
    this.treeView.badge = n ? { value: n, tooltip: `${n} suspect${n === 1 ? "" : "s"}` } : undefined;
    void vscode.commands.executeCommand("setContext", "ekka.hasReport", true);
    this.panel.refresh(update);
    this.diffPanel.refresh(update);
    this.emitter.fire();
    this.output.info(`Report updated (job ${update.jobId}): ${summarizeReport(update)}`);
  }

  private reportFor(jobId: string | undefined): ReportUpdated | undefined {
    return (jobId !== undefined ? this.byJob.get(jobId) : undefined) ?? this.latestReport;
  }

  /** "Ekka: Show divergence": no argument (latest report), a code lens's `{jobId, module}`, or a tree node. */
  showDivergence(arg?: unknown): boolean {
    const a = (arg ?? {}) as { jobId?: string; module?: string; suspect?: { target: { module: string } } };
    const update = this.reportFor(a.jobId);
    if (update === undefined) {
      void vscode.window.showInformationMessage('Ekka: no report yet. Run "Ekka: Diagnose silent error" first.');
      return false;
    }
    const module = a.module ?? a.suspect?.target.module;
    this.panel.show(update, module);
    return true;
  }

  /** The release-bisection code lens's `{jobId, symbol?}`: the diffs of the report's `bisect` section. */
  showReleaseDiff(arg?: unknown): boolean {
    const a = (arg ?? {}) as { jobId?: string; symbol?: string };
    const update = this.reportFor(typeof a.jobId === "string" ? a.jobId : undefined);
    if (update === undefined || !update.report.bisect) {
      void vscode.window.showInformationMessage(
        "Ekka: no release bisection in this report (run `ekka bisect` to find the release that broke it).",
      );
      return false;
    }
    return this.diffPanel.show(update, typeof a.symbol === "string" ? a.symbol : undefined);
  }

  /** The call site of a suspect: a tree node, or `{jobId, module}`. */
  openCallSite(arg?: unknown): Promise<boolean> {
    const a = (arg ?? {}) as { jobId?: string; module?: string; suspect?: Suspect };
    let suspect = a.suspect;
    if (suspect === undefined) {
      const update = this.reportFor(a.jobId);
      suspect = update === undefined ? undefined : findSuspect(update.report, a.module, a.module === undefined ? 1 : undefined);
    }
    if (suspect === undefined) {
      void vscode.window.showInformationMessage("Ekka: no suspect to show.");
      return Promise.resolve(false);
    }
    const where = callSiteLocation(suspect) ?? classLocation(suspect);
    return openLocation(where);
  }

  /** "Ekka: Clear Results": forgets every report, empties the view, closes the panels, then clears the server's
   * diagnostics and results when it runs. */
  async clear(server: Pick<EkkaServer, "running" | "clearResults">): Promise<void> {
    this.latestReport = undefined;
    this.byJob.clear();
    this.tree.setReport(undefined);
    this.treeView.message = undefined;
    this.treeView.badge = undefined;
    this.panel.close();
    this.diffPanel.close();
    void vscode.commands.executeCommand("setContext", "ekka.hasReport", false);
    if (server.running) {
      await server.clearResults();
      this.emitter.fire();
    }
    this.output.info("Results cleared.");
  }

  dispose(): void {
    this.emitter.dispose();
    this.tree.dispose();
    this.panel.dispose();
    this.diffPanel.dispose();
    this.treeView.dispose();
  }
}
