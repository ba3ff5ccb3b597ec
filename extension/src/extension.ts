// Thin client (ruff-vscode style): UI commands, a status bar item, the "Silent errors" tree, the divergence
// webview, and a LanguageClient that launches the Ekka language server over stdio with the user's interpreter.
// The work happens in the Python server; the logic kept here lives in small modules (interpreter, format,
// suspects, plot, jobs) that the unit tests load without VS Code.
import * as fs from "node:fs";
import * as path from "node:path";
import * as vscode from "vscode";
import {
  CloseAction,
  ErrorAction,
  LanguageClient,
  LanguageClientOptions,
  RevealOutputChannelOn,
  ServerOptions,
  TransportKind,
} from "vscode-languageclient/node";
import type { ClientCapabilities, FeatureState, StaticFeature } from "vscode-languageclient/node";
import { baseName, isDiagnosableFile, summarizeReport } from "./format";
import { BUNDLED_ENTRY, resolveInterpreter, serverLaunch } from "./interpreter";
import { JobTracker, followJob, statusFor } from "./jobs";
import {
  type DiagnoseArgs,
  JOB_STATE_NOTIFICATION,
  type JobState,
  REPORT_UPDATED_NOTIFICATION,
  REQUEST_FAILED,
  type ReportUpdated,
  SERVER_CANCEL_COMMAND,
  SERVER_CLEAR_COMMAND,
  SERVER_DIAGNOSE_COMMAND,
  SHOW_DIVERGENCE_COMMAND,
  SHOW_RELEASE_DIFF_COMMAND,
} from "./protocol";
import { onDidChangePythonInterpreter, pythonExtensionInterpreter } from "./pythonExtension";
import { getServerSettings } from "./settings";
import { SECRET_KEY, clearApiKey, serverEnv, setApiKey } from "./secrets";
import { type SourceLocation, type SuspectNode, callSiteLocation, classLocation, findSuspect } from "./suspects";
import { OPEN_LOCATION_COMMAND, SuspectTreeProvider, openLocation } from "./tree";
import { DivergencePanel, ReleaseDiffPanel } from "./webview";

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

export const SUSPECTS_VIEW = "ekka.suspects";

/** EKKA_* variables of the extension host's environment that are forwarded to the engine (tests and benchmarks:
 * re-inject a known bug so that a demo spec reproduces it; see server/protocol.py, `env`). */
export const FORWARDED_ENV = ["EKKA_INJECT_BUG"] as const;

/** What activate() returns (the extension's API); the tests use it to wait for the first server start. */
export interface EkkaApi {
  /** Resolves to true once the server has started, false if it could not start. Never rejects. */
  serverReady: Promise<boolean>;
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Turns off the client's work-done-progress capability: the server then reports progress only through
 * `ekka/jobState`, which the extension shows as one notification with Cancel (no second status-bar spinner). */
export const noServerProgressFeature: StaticFeature = {
  fillClientCapabilities(capabilities: ClientCapabilities): void {
    capabilities.window = { ...(capabilities.window ?? {}), workDoneProgress: false };
  },
  initialize(): void {},
  getState(): FeatureState {
    return { kind: "static" };
  },
  clear(): void {},
};

type ExtensionContextLike = Pick<vscode.ExtensionContext, "subscriptions"> &
  Partial<Pick<vscode.ExtensionContext, "secrets" | "extensionPath">>;

class Ekka implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private pending: Promise<boolean> = Promise.resolve(false);
  private readonly reports = new Map<string, ReportUpdated>();
  private latestReport: ReportUpdated | undefined;
  readonly jobs = new JobTracker();
  readonly tree = new SuspectTreeProvider();
  readonly panel = new DivergencePanel();
  readonly diffPanel = new ReleaseDiffPanel();
  treeView: vscode.TreeView<SuspectNode> | undefined;

  constructor(
    private readonly context: ExtensionContextLike,
    private readonly output: vscode.LogOutputChannel,
    private readonly status: vscode.StatusBarItem,
  ) {
    this.jobs.onDidChange(() => this.updateStatus());
  }

  private workspaceRoot(): string | undefined {
    return vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  }

  private updateStatus(): void {
    const job = this.jobs.latest;
    const report = job === undefined ? undefined : this.reports.get(job.jobId);
    const { text, tooltip } = statusFor(job, report ? summarizeReport(report.report) : undefined);
    this.status.text = text;
    this.status.tooltip = tooltip;
    this.status.command = this.latestReport !== undefined ? `${SUSPECTS_VIEW}.focus` : COMMANDS.diagnose;
    void vscode.commands.executeCommand("setContext", "ekka.jobRunning", this.jobs.running !== undefined);
  }

  private setStatus(text: string, tooltip: string): void {
    this.status.text = text;
    this.status.tooltip = tooltip;
  }

  /** Starts the server; failures are logged and shown in the status bar, never thrown. */
  start(): Promise<boolean> {
    this.pending = this.pending.then(() => this.doStart());
    return this.pending;
  }

  /** Stops the running server (if any), then starts a new one. */
  restart(): Promise<boolean> {
    this.pending = this.pending.then(async () => {
      await this.doStop();
      return this.doStart();
    });
    return this.pending;
  }

  stop(): Promise<void> {
    const stopped = this.pending.then(() => this.doStop());
    this.pending = stopped.then(() => false);
    return stopped;
  }

  private bundledEntry(): string | undefined {
    const ext = this.context.extensionPath;
    if (!ext) return undefined;
    const entry = path.join(ext, ...BUNDLED_ENTRY);
    return fs.existsSync(entry) ? entry : undefined;
  }

  private async doStart(): Promise<boolean> {
    const root = this.workspaceRoot();
    this.setStatus("$(sync~spin) Ekka", "Ekka: starting the language server");
    let client: LanguageClient | undefined;
    try {
      // One typed settings object per workspace folder; the server process runs with the first folder's
      // interpreter (the same precedence the server applies to each job's folder: interpreter.ts).
      const settings = await getServerSettings(pythonExtensionInterpreter);
      const first = settings.settings[0] ?? settings.globalSettings;
      const interpreter = resolveInterpreter(
        first.interpreter,
        root,
        (p) => fs.existsSync(p),
        process.platform,
        first.pythonInterpreter,
      );
      const launch = serverLaunch(interpreter, root, this.bundledEntry());
      this.output.info(
        `Starting Ekka server (${launch.source}): ${launch.command} ${launch.args.join(" ")} (cwd: ${launch.cwd ?? "<none>"})`,
      );
      const apiKey = this.context.secrets ? await this.context.secrets.get(SECRET_KEY) : undefined;
      if (apiKey) this.output.info("Anthropic API key: from the secret storage (ANTHROPIC_API_KEY).");

      const serverOptions: ServerOptions = {
        command: launch.command,
        args: launch.args,
        transport: TransportKind.stdio,
        options: { cwd: launch.cwd, env: serverEnv(process.env, apiKey) },
      };
      const clientOptions: LanguageClientOptions = {
        documentSelector: [
          { scheme: "file", language: "python" },
          { scheme: "file", pattern: "**/*.ekka.toml" },
        ],
        outputChannel: this.output,
        traceOutputChannel: this.output,
        revealOutputChannelOn: RevealOutputChannelOn.Never,
        // Settings go as typed per-folder objects (settings.ts), at start and on every change (pushSettings),
        // never as the raw configuration section.
        initializationOptions: settings,
        // A server that is missing or crashes is reported once in the output channel; the user restarts it
        // with "Ekka: Restart Server" instead of getting the client's repeated restart pop-ups.
        initializationFailedHandler: (error) => {
          this.output.error(`Ekka server failed to initialize: ${errorText(error)}`);
          return false;
        },
        errorHandler: {
          error: (error) => {
            this.output.error(`Ekka server connection error: ${errorText(error)}`);
            return { action: ErrorAction.Shutdown, handled: true };
          },
          closed: () => {
            this.output.warn('Ekka server stopped. Run "Ekka: Restart Server" to start it again.');
            this.jobs.failRunning("the Ekka language server stopped");
            this.setStatus("$(warning) Ekka", "Ekka: the language server stopped (see the Ekka output)");
            return { action: CloseAction.DoNotRestart, handled: true };
          },
        },
      };

      client = new LanguageClient("ekka", "Ekka", serverOptions, clientOptions);
      client.registerFeature(noServerProgressFeature);
      client.onNotification(REPORT_UPDATED_NOTIFICATION, (update: ReportUpdated) => this.onReport(update));
      client.onNotification(JOB_STATE_NOTIFICATION, (job: JobState) => this.jobs.update(job));
      await client.start();
      this.client = client;
      this.updateStatus();
      this.output.info("Ekka server started.");
      return true;
    } catch (err) {
      this.output.error(`Could not start the Ekka server: ${errorText(err)}`);
      this.output.error(
        'Check the "ekka.interpreter" setting: it must name a Python (3.10+) that can run the Ekka server.',
      );
      this.setStatus("$(warning) Ekka", "Ekka: the language server is not running (see the Ekka output)");
      if (client !== undefined) {
        try {
          await client.dispose();
        } catch {
          // a client that never started cannot be stopped; nothing left to clean up
        }
      }
      this.client = undefined;
      return false;
    }
  }

  private async doStop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.jobs.failRunning("the Ekka language server was stopped");
    if (client === undefined) {
      return;
    }
    try {
      await client.stop();
    } catch (err) {
      this.output.warn(`Stopping the Ekka server: ${errorText(err)}`);
    }
  }

  /** Sends every folder's settings again (after a settings or workspace-folder change). */
  async pushSettings(): Promise<void> {
    const client = this.client;
    if (client === undefined) return;
    try {
      const settings = await getServerSettings(pythonExtensionInterpreter);
      await client.sendNotification("workspace/didChangeConfiguration", { settings: { ekka: settings } });
    } catch (err) {
      this.output.warn(`Sending the settings to the Ekka server: ${errorText(err)}`);
    }
  }

  private executeServerCommand(command: string, args: unknown[]): Promise<unknown> {
    if (this.client === undefined) return Promise.reject(new Error("the Ekka server is not running"));
    return this.client.sendRequest("workspace/executeCommand", { command, arguments: args });
  }

  onReport(update: ReportUpdated): void {
    if (typeof update?.jobId !== "string" || update.report === undefined) return;
    this.reports.set(update.jobId, update);
    while (this.reports.size > 10) this.reports.delete(this.reports.keys().next().value as string);
    this.latestReport = update;
    this.tree.setReport(update);
    if (this.treeView !== undefined) {
      this.treeView.message = this.tree.message;
      const n = update.report.suspects.length;
      this.treeView.badge = n ? { value: n, tooltip: `${n} suspect${n === 1 ? "" : "s"}` } : undefined;
    }
    void vscode.commands.executeCommand("setContext", "ekka.hasReport", true);
    this.panel.refresh(update);
    this.diffPanel.refresh(update);
    this.updateStatus();
    this.output.info(`Report updated (job ${update.jobId}): ${update.report.verdict}: ${summarizeReport(update.report)}`);
  }

  private envForEngine(): Record<string, string> | undefined {
    const env: Record<string, string> = {};
    for (const name of FORWARDED_ENV) {
      const v = process.env[name];
      if (v) env[name] = v;
    }
    return Object.keys(env).length ? env : undefined;
  }

  /** Starts a diagnosis of a spec or repro script; resolves with its job id once the server accepted it. */
  async diagnose(resource?: vscode.Uri): Promise<string | undefined> {
    const uri = resource instanceof vscode.Uri ? resource : vscode.window.activeTextEditor?.document.uri;
    if (uri === undefined || !isDiagnosableFile(uri.fsPath || uri.path)) {
      void vscode.window.showWarningMessage("Ekka: open a Python repro script or a *.ekka.toml spec to diagnose.");
      return undefined;
    }
    if (this.client === undefined) {
      this.output.error(`Cannot diagnose ${uri.toString()}: the Ekka server is not running.`);
      void vscode.window.showErrorMessage('Ekka: the language server is not running. See the "Ekka" output.');
      return undefined;
    }
    const args: DiagnoseArgs = { uri: uri.toString() };
    const env = this.envForEngine();
    if (env !== undefined) {
      args.env = env;
      this.output.info(`Forwarding ${Object.keys(env).join(", ")} to the engine.`);
    }
    let result: unknown;
    try {
      result = await this.executeServerCommand(SERVER_DIAGNOSE_COMMAND, [args]);
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
    const jobId =
      typeof result === "object" && result !== null && typeof (result as { jobId?: unknown }).jobId === "string"
        ? (result as { jobId: string }).jobId
        : typeof result === "string"
          ? result
          : undefined;
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
    if (job.state === "done" && this.reports.has(job.jobId)) {
      void vscode.commands.executeCommand(`${SUSPECTS_VIEW}.focus`).then(undefined, () => undefined);
    } else if (job.state === "failed" && this.client === undefined) {
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
      const record = (await this.executeServerCommand(SERVER_CANCEL_COMMAND, [{ jobId: id }])) as JobState | null;
      if (record && typeof record.jobId === "string") this.jobs.update(record);
    } catch (err) {
      this.output.error(`Cancelling job ${id}: ${errorText(err)}`);
    }
  }

  private reportFor(jobId: string | undefined): ReportUpdated | undefined {
    return (jobId !== undefined ? this.reports.get(jobId) : undefined) ?? this.latestReport;
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
    const a = (arg ?? {}) as { jobId?: string; module?: string; suspect?: ReportUpdated["report"]["suspects"][number] };
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

  async clearResults(): Promise<void> {
    this.latestReport = undefined;
    this.reports.clear();
    this.tree.setReport(undefined);
    if (this.treeView !== undefined) {
      this.treeView.message = undefined;
      this.treeView.badge = undefined;
    }
    this.panel.close();
    this.diffPanel.close();
    void vscode.commands.executeCommand("setContext", "ekka.hasReport", false);
    if (this.client !== undefined) {
      this.client.diagnostics?.clear();
      try {
        await this.executeServerCommand(SERVER_CLEAR_COMMAND, []);
      } catch (err) {
        this.output.warn(`Clearing the server's results: ${errorText(err)}`);
      }
      this.updateStatus();
    }
    this.output.info("Results cleared.");
  }

  async apiKeyChanged(): Promise<void> {
    if (this.jobs.running !== undefined) {
      void vscode.window.showInformationMessage(
        'Ekka: the key is used from the next server start ("Ekka: Restart Server") — a diagnosis is running now.',
      );
      return;
    }
    await this.restart();
  }

  get report(): ReportUpdated | undefined {
    return this.latestReport;
  }

  dispose(): void {
    void this.stop();
    this.jobs.dispose();
    this.tree.dispose();
    this.panel.dispose();
    this.diffPanel.dispose();
  }
}

let current: Ekka | undefined;

export function activate(context: vscode.ExtensionContext): EkkaApi {
  const output = vscode.window.createOutputChannel("Ekka", { log: true });
  const status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
  status.name = "Ekka";
  status.command = COMMANDS.diagnose;
  status.text = "$(beaker) Ekka";
  status.show();

  const ekka = new Ekka(context, output, status);
  current = ekka;
  const treeView = vscode.window.createTreeView(SUSPECTS_VIEW, { treeDataProvider: ekka.tree, showCollapseAll: true });
  ekka.treeView = treeView;

  const secrets = context.secrets;
  context.subscriptions.push(
    output,
    status,
    ekka,
    treeView,
    vscode.commands.registerCommand(COMMANDS.diagnose, (uri?: vscode.Uri) => ekka.diagnose(uri)),
    vscode.commands.registerCommand(COMMANDS.cancel, (jobId?: string) => ekka.cancel(jobId)),
    vscode.commands.registerCommand(COMMANDS.showDivergence, (arg?: unknown) => ekka.showDivergence(arg)),
    vscode.commands.registerCommand(COMMANDS.showReleaseDiff, (arg?: unknown) => ekka.showReleaseDiff(arg)),
    vscode.commands.registerCommand(COMMANDS.restartServer, () => ekka.restart()),
    vscode.commands.registerCommand(COMMANDS.clearResults, () => ekka.clearResults()),
    vscode.commands.registerCommand(COMMANDS.showLogs, () => output.show()),
    vscode.commands.registerCommand(COMMANDS.setApiKey, async () => {
      if (secrets === undefined) return false;
      const stored = await setApiKey(secrets);
      if (stored) await ekka.apiKeyChanged();
      return stored;
    }),
    vscode.commands.registerCommand(COMMANDS.clearApiKey, async () => {
      if (secrets === undefined) return false;
      const removed = await clearApiKey(secrets);
      if (removed) await ekka.apiKeyChanged();
      return removed;
    }),
    vscode.commands.registerCommand(COMMANDS.openCallSite, (arg?: unknown) => ekka.openCallSite(arg)),
    vscode.commands.registerCommand(COMMANDS.openLocation, (loc?: SourceLocation) => openLocation(loc)),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration("ekka.interpreter")) {
        output.info("ekka.interpreter changed; restarting the server.");
        void ekka.restart();
      } else if (e.affectsConfiguration("ekka")) {
        void ekka.pushSettings();
      }
    }),
    vscode.workspace.onDidChangeWorkspaceFolders(() => void ekka.pushSettings()),
  );
  void onDidChangePythonInterpreter(() => {
    if ((vscode.workspace.getConfiguration("ekka").get<string>("interpreter") ?? "").trim() === "") {
      output.info("The Python extension's interpreter changed; restarting the server.");
      void ekka.restart();
    }
  }).then((d) => d && context.subscriptions.push(d));

  // Not awaited: activation must not wait for (or fail with) the Python server.
  const serverReady = ekka.start().catch((err: unknown) => {
    output.error(`Unexpected error while starting the Ekka server: ${errorText(err)}`);
    return false;
  });
  return { serverReady };
}

export async function deactivate(): Promise<void> {
  const ekka = current;
  current = undefined;
  await ekka?.stop();
}
