// The Ekka language server's lifecycle (the shape of vscode-python-tools-extension-template's src/common/server.ts):
// find the interpreter, create the LanguageClient (createServer), start, restart and stop it, send it the settings
// again when they change, restart it when the interpreter changes, and never start it in an untrusted workspace
// (the interpreter and the code it runs are the workspace's to choose).
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
import { errorText } from "./format";
import { BUNDLED_ENTRY, type ServerLaunch, resolveInterpreter, serverLaunch } from "./interpreter";
import {
  JOB_STATE_NOTIFICATION,
  type JobState,
  REPORT_UPDATED_NOTIFICATION,
  type ReportUpdated,
  SERVER_CLEAR_COMMAND,
} from "./protocol";
import { onDidChangePythonInterpreter, pythonExtensionInterpreter } from "./pythonExtension";
import { SECRET_KEY, serverEnv } from "./secrets";
import { type ServerSettings, getServerSettings } from "./settings";

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

/** What the server's state shows in the status bar ("running": back to the latest job's state). */
export type ServerState = "starting" | "running" | "failed" | "closed" | "untrusted";

export interface ServerStatus {
  serverState(state: ServerState): void;
}

/** What the server tells the rest of the extension. */
export interface ServerEvents {
  /** `ekka/reportUpdated`. */
  onReport(update: ReportUpdated): void;
  /** `ekka/jobState`. */
  onJobState(job: JobState): void;
  /** The server was stopped or went away: the jobs it was running are over (`why` is their message). */
  onGone(why: string): void;
}

export type ServerContext = Partial<Pick<vscode.ExtensionContext, "secrets" | "extensionPath">>;

/** The LanguageClient for one launch of the server, its notifications routed to `events` (not started). */
export function createServer(
  launch: ServerLaunch,
  settings: ServerSettings,
  env: NodeJS.ProcessEnv,
  output: vscode.LogOutputChannel,
  status: ServerStatus,
  events: ServerEvents,
): LanguageClient {
  const serverOptions: ServerOptions = {
    command: launch.command,
    args: launch.args,
    transport: TransportKind.stdio,
    options: { cwd: launch.cwd, env },
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [
      { scheme: "file", language: "python" },
      { scheme: "file", pattern: "**/*.ekka.toml" },
    ],
    outputChannel: output,
    traceOutputChannel: output,
    revealOutputChannelOn: RevealOutputChannelOn.Never,
    // Settings go as typed per-folder objects (settings.ts), at start and on every change (pushSettings),
    // never as the raw configuration section.
    initializationOptions: settings,
    // A server that is missing or crashes is reported once in the output channel; the user restarts it
    // with "Ekka: Restart Server" instead of getting the client's repeated restart pop-ups.
    initializationFailedHandler: (error) => {
      output.error(`Ekka server failed to initialize: ${errorText(error)}`);
      return false;
    },
    errorHandler: {
      error: (error) => {
        output.error(`Ekka server connection error: ${errorText(error)}`);
        return { action: ErrorAction.Shutdown, handled: true };
      },
      closed: () => {
        output.warn('Ekka server stopped. Run "Ekka: Restart Server" to start it again.');
        events.onGone("the Ekka language server stopped");
        status.serverState("closed");
        return { action: CloseAction.DoNotRestart, handled: true };
      },
    },
  };
  const client = new LanguageClient("ekka", "Ekka", serverOptions, clientOptions);
  client.registerFeature(noServerProgressFeature);
  client.onNotification(REPORT_UPDATED_NOTIFICATION, (update: ReportUpdated) => events.onReport(update));
  client.onNotification(JOB_STATE_NOTIFICATION, (job: JobState) => events.onJobState(job));
  return client;
}

/** Owns the one LanguageClient; start, restart and stop run one after the other, and never throw. */
export class EkkaServer implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private pending: Promise<boolean> = Promise.resolve(false);

  constructor(
    private readonly context: ServerContext,
    private readonly output: vscode.LogOutputChannel,
    private readonly status: ServerStatus,
    private readonly events: ServerEvents,
  ) {}

  /** Whether a started server is there to take requests. */
  get running(): boolean {
    return this.client !== undefined;
  }

  /** Starts the server unless it runs already; failures are logged and shown in the status bar, never thrown.
   * Resolves to false in an untrusted workspace (the server starts once the workspace is trusted). */
  start(): Promise<boolean> {
    this.pending = this.pending.then(() => (this.client !== undefined ? true : this.doStart()));
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
    if (!vscode.workspace.isTrusted) {
      // The interpreter (ekka.interpreter, the Python extension's choice, the folder's .venv) and the server's
      // working directory are the workspace's: Restricted Mode runs none of them.
      this.output.warn("This workspace is not trusted: the Ekka server starts once you trust it (Restricted Mode).");
      this.status.serverState("untrusted");
      return false;
    }
    const root = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
    this.status.serverState("starting");
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

      client = createServer(launch, settings, serverEnv(process.env, apiKey), this.output, this.status, this.events);
      await client.start();
      this.client = client;
      this.status.serverState("running");
      this.output.info("Ekka server started.");
      return true;
    } catch (err) {
      this.output.error(`Could not start the Ekka server: ${errorText(err)}`);
      this.output.error(
        'Check the "ekka.interpreter" setting: it must name a Python (3.10+) that can run the Ekka server.',
      );
      this.status.serverState("failed");
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
    this.events.onGone("the Ekka language server was stopped");
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

  /** `workspace/executeCommand` on the server; rejects when it is not running. */
  executeCommand(command: string, args: unknown[]): Promise<unknown> {
    if (this.client === undefined) return Promise.reject(new Error("the Ekka server is not running"));
    return this.client.sendRequest("workspace/executeCommand", { command, arguments: args });
  }

  /** Clears the server's diagnostics and results (nothing when it is not running); never rejects. */
  async clearResults(): Promise<void> {
    if (this.client === undefined) return;
    this.client.diagnostics?.clear();
    try {
      await this.executeCommand(SERVER_CLEAR_COMMAND, []);
    } catch (err) {
      this.output.warn(`Clearing the server's results: ${errorText(err)}`);
    }
  }

  dispose(): void {
    void this.stop();
  }
}

/**
 * Restarts the server when the interpreter may have changed (ekka.interpreter, or the Python extension's
 * interpreter while that setting is empty), sends the settings again on any other ekka.* or workspace-folder
 * change, and starts it once an untrusted workspace is trusted. The disposables go to `subscriptions`.
 */
export function watchServer(
  server: EkkaServer,
  output: vscode.LogOutputChannel,
  subscriptions: vscode.Disposable[],
): void {
  subscriptions.push(
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration("ekka.interpreter")) {
        output.info("ekka.interpreter changed; restarting the server.");
        void server.restart();
      } else if (e.affectsConfiguration("ekka")) {
        void server.pushSettings();
      }
    }),
    vscode.workspace.onDidChangeWorkspaceFolders(() => void server.pushSettings()),
    vscode.workspace.onDidGrantWorkspaceTrust(() => {
      output.info("The workspace is trusted now; starting the server.");
      void server.start();
    }),
  );
  void onDidChangePythonInterpreter(() => {
    if ((vscode.workspace.getConfiguration("ekka").get<string>("interpreter") ?? "").trim() === "") {
      output.info("The Python extension's interpreter changed; restarting the server.");
      void server.restart();
    }
  }).then((d) => d && subscriptions.push(d));
}
