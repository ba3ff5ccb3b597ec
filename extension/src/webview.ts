// "Ekka: Show divergence": one webview panel with the plots of a report (SVG from plot.ts, strict CSP + nonce).
import * as crypto from "node:crypto";
import * as vscode from "vscode";
import { divergenceHtml, makeNonce } from "./plot";
import type { ReportUpdated } from "./protocol";
import { classLocation, findSuspect } from "./suspects";
import { openLocation } from "./tree";

export const VIEW_TYPE = "ekka.divergence";

export class DivergencePanel implements vscode.Disposable {
  private panel: vscode.WebviewPanel | undefined;
  private shown: { update: ReportUpdated; highlight?: string } | undefined;

  get visible(): boolean {
    return this.panel !== undefined;
  }

  /** Which report (job) and component the panel shows. */
  get showing(): { jobId: string; highlight?: string } | undefined {
    return this.shown === undefined ? undefined : { jobId: this.shown.update.jobId, highlight: this.shown.highlight };
  }

  show(update: ReportUpdated, highlight?: string): void {
    this.shown = { update, highlight };
    if (this.panel === undefined) {
      this.panel = vscode.window.createWebviewPanel(
        VIEW_TYPE,
        "Ekka: divergence",
        { viewColumn: vscode.ViewColumn.Beside, preserveFocus: false },
        { enableScripts: true, localResourceRoots: [], retainContextWhenHidden: false },
      );
      this.panel.onDidDispose(() => {
        this.panel = undefined;
        this.shown = undefined;
      });
      this.panel.webview.onDidReceiveMessage((msg: { type?: string; rank?: number }) => {
        if (msg?.type === "open" && this.shown !== undefined) {
          const s = findSuspect(this.shown.update.report, undefined, msg.rank);
          if (s !== undefined) void openLocation(classLocation(s));
        }
      });
    } else {
      this.panel.reveal(undefined, false);
    }
    this.render();
  }

  /** A new report arrived: an open panel switches to it. */
  refresh(update: ReportUpdated): void {
    if (this.panel !== undefined) {
      this.shown = { update };
      this.render();
    }
  }

  private render(): void {
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
    });
  }

  close(): void {
    this.panel?.dispose();
  }

  dispose(): void {
    this.close();
  }
}
