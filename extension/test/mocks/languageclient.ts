// Stand-in for 'vscode-languageclient/node' (the real one needs a running VS Code). Enum values are copied from
// vscode-languageclient 9; test/languageclient-mock.test.ts checks them and the used methods against the real module.

export enum TransportKind {
  stdio = 0,
  ipc = 1,
  pipe = 2,
  socket = 3,
}
export enum RevealOutputChannelOn {
  Debug = 0,
  Info = 1,
  Warn = 2,
  Error = 3,
  Never = 4,
}
export enum CloseAction {
  DoNotRestart = 1,
  Restart = 2,
}
export enum ErrorAction {
  Continue = 1,
  Shutdown = 2,
}

/** How the next LanguageClient behaves; tests set it before activate() / restart. */
export const behavior: {
  /** Thrown by the constructor, e.g. to simulate a bad option. */
  constructError: Error | undefined;
  /** start() rejects with this, e.g. spawn ENOENT for a missing interpreter. */
  startError: Error | undefined;
  /** What sendRequest() resolves to, or the error it rejects with. */
  requestResult: unknown;
  requestError: Error | undefined;
  /** When set, answers each request instead of requestResult/requestError (may throw). */
  requestHandler: ((method: string, params: unknown) => unknown) | undefined;
} = {
  constructError: undefined,
  startError: undefined,
  requestResult: undefined,
  requestError: undefined,
  requestHandler: undefined,
};

export class LanguageClient {
  static instances: LanguageClient[] = [];

  state: "constructed" | "running" | "startFailed" | "stopped" | "disposed" = "constructed";
  readonly notificationHandlers = new Map<string, (params: unknown) => void>();
  readonly requests: { method: string; params: unknown }[] = [];
  readonly sentNotifications: { method: string; params: unknown }[] = [];
  diagnosticsCleared = 0;
  readonly diagnostics = { clear: () => void this.diagnosticsCleared++ };
  readonly features: unknown[] = [];

  constructor(
    readonly id: string,
    readonly name: string,
    readonly serverOptions: {
      command: string;
      args?: string[];
      transport?: TransportKind;
      options?: { cwd?: string; env?: Record<string, string | undefined> };
    },
    readonly clientOptions: Record<string, unknown>,
  ) {
    if (behavior.constructError !== undefined) {
      throw behavior.constructError;
    }
    LanguageClient.instances.push(this);
  }

  registerFeature(feature: unknown): void {
    this.features.push(feature);
  }

  onNotification(method: string, handler: (params: unknown) => void): { dispose(): void } {
    this.notificationHandlers.set(method, handler);
    return { dispose: () => this.notificationHandlers.delete(method) };
  }

  async start(): Promise<void> {
    await Promise.resolve(); // like the real client: the result arrives asynchronously
    if (behavior.startError !== undefined) {
      this.state = "startFailed";
      throw behavior.startError;
    }
    this.state = "running";
  }

  async stop(): Promise<void> {
    if (this.state !== "running") {
      // the real client rejects too: "Client is not running and can't be stopped"
      throw new Error(`Client is not running and can't be stopped. It's current state is: ${this.state}`);
    }
    this.state = "stopped";
  }

  async dispose(): Promise<void> {
    this.state = "disposed";
  }

  async sendRequest(method: string, params: unknown): Promise<unknown> {
    if (this.state !== "running") {
      throw new Error("Client is not running");
    }
    this.requests.push({ method, params });
    if (behavior.requestHandler !== undefined) {
      return behavior.requestHandler(method, params);
    }
    if (behavior.requestError !== undefined) {
      throw behavior.requestError;
    }
    return behavior.requestResult;
  }

  async sendNotification(method: string, params: unknown): Promise<void> {
    if (this.state !== "running") {
      throw new Error("Client is not running");
    }
    this.sentNotifications.push({ method, params });
  }

  /** Test helper: deliver a server notification as the real client would. */
  notify(method: string, params: unknown): void {
    const handler = this.notificationHandlers.get(method);
    if (handler === undefined) {
      throw new Error(`no handler for ${method}`);
    }
    handler(params);
  }
}

export function resetLanguageClientMock(): void {
  LanguageClient.instances.length = 0;
  behavior.constructError = undefined;
  behavior.startError = undefined;
  behavior.requestResult = undefined;
  behavior.requestError = undefined;
  behavior.requestHandler = undefined;
}
