// "Ekka: Show divergence": one webview panel with the plots of a report (SVG from plot.ts, strict CSP + nonce); and
// the release-diff panel (releaseDiff.ts): the unified diffs of a report's `bisect` section.
import * as crypto from "node:crypto";
import * as vscode from "vscode";
import { divergenceHtml, makeNonce } from "./plot";
import type { ReportUpdated } from "./protocol";
import { releaseDiffHtml } from "./releaseDiff";
import { classLocation, findSuspect } from "./suspects";
import { openLocation } from "./tree";

export const VIEW_TYPE = "ekka.divergence";
export const RELEASE_DIFF_VIEW_TYPE = "ekka.releaseDiff";

/** One webview panel showing one report (`shown`), created on first show and reused (revealed) after. */
abstract class ReportPanel<S extends { update: ReportUpdated }> implements vscode.Disposable {
  protected panel: vscode.WebviewPanel | undefined;
  protected shown: S | undefined;

  constructor(
    private readonly viewType: string,
    private readonly title: string,
  ) {}

  get visible(): boolean {
    return this.panel !== undefined;
  }

  /** Which report (job) the panel shows, and what in it (the component or symbol shown). */
  get showing(): (Omit<S, "update"> & { jobId: string }) | undefined {
    if (this.shown === undefined) return undefined;
    const { update, ...rest } = this.shown;
    return { ...rest, jobId: update.jobId };
  }

  /** Shows `shown` in the panel (opened beside the editor, or revealed), then renders it. */
  protected open(shown: S): void {
    this.shown = shown;
    if (this.panel === undefined) {
      this.panel = vscode.window.createWebviewPanel(
        this.viewType,
        this.title,
        { viewColumn: vscode.ViewColumn.Beside, preserveFocus: false },
        { enableScripts: true, localResourceRoots: [], retainContextWhenHidden: false },
      );
      this.panel.onDidDispose(() => {
        this.panel = undefined;
        this.shown = undefined;
      });
      this.panel.webview.onDidReceiveMessage((msg: unknown) => this.onMessage(msg));
    } else {
      this.panel.reveal(undefined, false);
    }
    this.render();
  }

  /** A message the page posted (none by default). */
  protected onMessage(_msg: unknown): void {}

  protected abstract render(): void;

  close(): void {
    this.panel?.dispose();
  }

  dispose(): void {
    this.close();
  }
}

export class DivergencePanel extends ReportPanel<{ update: ReportUpdated; highlight?: string }> {
  constructor() {
    super(VIEW_TYPE, "Ekka: divergence");
  }

  show(update: ReportUpdated, highlight?: string): void {
    this.open({ update, highlight });
  }

  /** A new report arrived: an open panel switches to it. */
  refresh(update: ReportUpdated): void {
    if (this.panel !== undefined) {
      this.shown = { update };
      this.render();
    }
  }

  protected onMessage(message: unknown): void {
    const msg = message as { type?: string; rank?: number } | undefined;
    if (msg?.type === "open" && this.shown !== undefined) {
      const s = findSuspect(this.shown.update.report, undefined, msg.rank);
      if (s !== undefined) void openLocation(classLocation(s));
    }
  }

  protected render(): void {
    if (this.panel === undefined || this.shown === undefined) return;
    const { update, highlight } = this.shown;
    const subject = update.uri ? decodeURIComponent(update.uri.replace(/^file:\/\//, "")) : undefined;
    this.panel.title = `Ekka: divergence (${update.report.verdict})`;
    this.panel.webview.html = divergenceHtml(update.report, {
      cspSource: this.panel.webview.cspSource,
      nonce: makeNonce((n) => crypto.randomBytes(n)),
      jobId: update.jobId,
      highlight,
      subject,
      headline: update.headline,
    });
  }
}

/** One panel with the diffs of the report's bisection (what changed between the last good and first bad release). */
export class ReleaseDiffPanel extends ReportPanel<{ update: ReportUpdated; symbol?: string }> {
  constructor() {
    super(RELEASE_DIFF_VIEW_TYPE, "Ekka: release diff");
  }

  /** Shows `update`'s bisection; false (nothing opened) when the report has none. */
  show(update: ReportUpdated, symbol?: string): boolean {
    if (!update.report.bisect) return false;
    this.open({ update, symbol });
    return true;
  }

  /** A new report arrived: an open panel switches to its bisection, or closes when it has none. */
  refresh(update: ReportUpdated): void {
    if (this.panel === undefined) return;
    if (!update.report.bisect) {
      this.close();
      return;
    }
    this.shown = { update };
    this.render();
  }

  protected render(): void {
    const b = this.shown?.update.report.bisect;
    if (this.panel === undefined || this.shown === undefined || !b) return;
    this.panel.title = b.first_bad ? `Ekka: changed in ${b.first_bad}` : "Ekka: release diff";
    this.panel.webview.html = releaseDiffHtml(b, {
      cspSource: this.panel.webview.cspSource,
      nonce: makeNonce((n) => crypto.randomBytes(n)),
      jobId: this.shown.update.jobId,
      symbol: this.shown.symbol,
    });
  }
}
