// Thin client (ruff-vscode style): UI commands, a status bar item, and a LanguageClient that launches
// `<interpreter> -m server` over stdio. The work happens in the Python server; the logic kept here lives in
// pure modules (interpreter.ts, format.ts) that the unit tests load without VS Code.
import * as fs from "node:fs";
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
import { isDiagnosableFile, summarizeReport } from "./format";
import { resolveInterpreter, serverLaunch } from "./interpreter";
import { REPORT_UPDATED_NOTIFICATION, Report, SERVER_DIAGNOSE_COMMAND } from "./protocol";

export const COMMANDS = {
  diagnose: "ekka.diagnose",
  restartServer: "ekka.restartServer",
  clearResults: "ekka.clearResults",
} as const;

/** What activate() returns (the extension's API); the tests use it to wait for the first server start. */
export interface EkkaApi {
  /** Resolves to true once the server has started, false if it could not start. Never rejects. */
  serverReady: Promise<boolean>;
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

class Ekka implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private pending: Promise<boolean> = Promise.resolve(false);
  private lastReport: Report | undefined;

  constructor(
    private readonly output: vscode.LogOutputChannel,
    private readonly status: vscode.StatusBarItem,
  ) {}

  private workspaceRoot(): string | undefined {
    return vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
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

  private async doStart(): Promise<boolean> {
    const root = this.workspaceRoot();
    this.setStatus("$(sync~spin) Ekka", "Ekka: starting the language server");
    let client: LanguageClient | undefined;
    try {
      const config = vscode.workspace.getConfiguration("ekka");
      const interpreter = resolveInterpreter(
        config.get<string>("interpreter"),
        root,
        (p) => fs.existsSync(p),
        process.platform,
      );
      const launch = serverLaunch(interpreter, root);
      this.output.info(`Starting Ekka server: ${launch.command} ${launch.args.join(" ")} (cwd: ${launch.cwd ?? "<none>"})`);

      const serverOptions: ServerOptions = {
        command: launch.command,
        args: launch.args,
        transport: TransportKind.stdio,
        options: { cwd: launch.cwd, env: { ...process.env, PYTHONUNBUFFERED: "1" } },
      };
      const clientOptions: LanguageClientOptions = {
        documentSelector: [
          { scheme: "file", language: "python" },
          { scheme: "file", pattern: "**/*.ekka.toml" },
        ],
        outputChannel: this.output,
        traceOutputChannel: this.output,
        revealOutputChannelOn: RevealOutputChannelOn.Never,
        initializationOptions: {
          settings: {
            interpreter,
            target: { default: config.get<string>("target.default", "vllm") },
            executor: config.get<string>("executor", "local"),
          },
        },
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
            this.setStatus("$(warning) Ekka", "Ekka: the language server stopped (see the Ekka output)");
            return { action: CloseAction.DoNotRestart, handled: true };
          },
        },
      };

      client = new LanguageClient("ekka", "Ekka", serverOptions, clientOptions);
      client.onNotification(REPORT_UPDATED_NOTIFICATION, (report: Report) => this.showReport(report));
      await client.start();
      this.client = client;
      this.setStatus("$(beaker) Ekka", "Ekka: ready. Click to diagnose the current file.");
      this.output.info("Ekka server started.");
      return true;
    } catch (err) {
      this.output.error(`Could not start the Ekka server: ${errorText(err)}`);
      this.output.error(
        'Check the "ekka.interpreter" setting, and that the interpreter can run "-m server" from the workspace root.',
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
    if (client === undefined) {
      return;
    }
    try {
      await client.stop();
    } catch (err) {
      this.output.warn(`Stopping the Ekka server: ${errorText(err)}`);
    }
  }

  private showReport(report: Report): void {
    this.lastReport = report;
    const summary = summarizeReport(report);
    this.setStatus(`$(bug) Ekka: ${summary}`, `Ekka: ${report.verdict} (${report.suspects.length} suspects)`);
    this.output.info(`Report updated: ${report.verdict}: ${summary}`);
  }

  async diagnose(resource?: vscode.Uri): Promise<void> {
    const uri = resource instanceof vscode.Uri ? resource : vscode.window.activeTextEditor?.document.uri;
    if (uri === undefined || !isDiagnosableFile(uri.fsPath || uri.path)) {
      void vscode.window.showWarningMessage("Ekka: open a Python repro script or a *.ekka.toml spec to diagnose.");
      return;
    }
    const client = this.client;
    if (client === undefined) {
      this.output.error(`Cannot diagnose ${uri.toString()}: the Ekka server is not running.`);
      void vscode.window.showErrorMessage('Ekka: the language server is not running. See the "Ekka" output.');
      return;
    }
    try {
      const jobId: unknown = await client.sendRequest("workspace/executeCommand", {
        command: SERVER_DIAGNOSE_COMMAND,
        arguments: [uri.toString()],
      });
      this.output.info(`Diagnosis of ${uri.toString()} started (job ${String(jobId)}).`);
      this.setStatus("$(sync~spin) Ekka: diagnosing", `Ekka: job ${String(jobId)}`);
    } catch (err) {
      this.output.error(`Diagnosis of ${uri.toString()} failed to start: ${errorText(err)}`);
      void vscode.window.showErrorMessage(`Ekka: diagnosis failed to start: ${errorText(err)}`);
    }
  }

  clearResults(): void {
    this.lastReport = undefined;
    this.client?.diagnostics?.clear();
    if (this.client !== undefined) {
      this.setStatus("$(beaker) Ekka", "Ekka: ready. Click to diagnose the current file.");
    }
    this.output.info("Results cleared.");
  }

  get report(): Report | undefined {
    return this.lastReport;
  }

  dispose(): void {
    void this.stop();
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

  const ekka = new Ekka(output, status);
  current = ekka;

  context.subscriptions.push(
    output,
    status,
    ekka,
    vscode.commands.registerCommand(COMMANDS.diagnose, (uri?: vscode.Uri) => ekka.diagnose(uri)),
    vscode.commands.registerCommand(COMMANDS.restartServer, () => ekka.restart()),
    vscode.commands.registerCommand(COMMANDS.clearResults, () => ekka.clearResults()),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration("ekka.interpreter")) {
        output.info("ekka.interpreter changed; restarting the server.");
        void ekka.restart();
      }
    }),
  );

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
