// A hand-written stand-in for the parts of the 'vscode' API that the extension uses
// (the pattern of microsoft/vscode-common-python-lsp's _vscode_mock.ts). Everything it is asked to do is
// recorded in `mock` so tests can assert on it; resetVscodeMock() starts a test from a clean state.

type Listener<T> = (e: T) => unknown;

export class Disposable {
  private disposed = false;
  constructor(private readonly onDispose: () => void = () => undefined) {}
  dispose(): void {
    if (!this.disposed) {
      this.disposed = true;
      this.onDispose();
    }
  }
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly path: string,
  ) {}
  static file(fsPath: string): Uri {
    return new Uri("file", fsPath.replace(/\\/g, "/"));
  }
  static parse(value: string): Uri {
    const m = /^([a-z][\w+.-]*):(?:\/\/[^/]*)?(.*)$/i.exec(value);
    if (m === null) {
      throw new Error(`mock Uri.parse: not a URI: ${value}`);
    }
    return new Uri(m[1], decodeURIComponent(m[2]));
  }
  get fsPath(): string {
    return this.scheme === "file" ? this.path : "";
  }
  toString(): string {
    return `${this.scheme}://${this.path}`;
  }
}

export class EventEmitter<T> {
  private listeners: Listener<T>[] = [];
  readonly event = (listener: Listener<T>): Disposable => {
    this.listeners.push(listener);
    return new Disposable(() => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    });
  };
  fire(e: T): void {
    for (const l of [...this.listeners]) l(e);
  }
  dispose(): void {
    this.listeners = [];
  }
  get listenerCount(): number {
    return this.listeners.length;
  }
}

export class Position {
  constructor(
    readonly line: number,
    readonly character: number,
  ) {}
}

export class Range {
  constructor(
    readonly start: Position,
    readonly end: Position,
  ) {}
}

export enum TreeItemCollapsibleState {
  None = 0,
  Collapsed = 1,
  Expanded = 2,
}

export class ThemeColor {
  constructor(readonly id: string) {}
}

export class ThemeIcon {
  constructor(
    readonly id: string,
    readonly color?: ThemeColor,
  ) {}
}

export class TreeItem {
  id?: string;
  description?: string;
  tooltip?: string;
  contextValue?: string;
  iconPath?: ThemeIcon;
  resourceUri?: Uri;
  command?: { command: string; title: string; arguments?: unknown[] };
  accessibilityInformation?: { label: string };
  constructor(
    readonly label: string,
    readonly collapsibleState: TreeItemCollapsibleState = TreeItemCollapsibleState.None,
  ) {}
}

export enum ProgressLocation {
  SourceControl = 1,
  Window = 10,
  Notification = 15,
}

export enum ViewColumn {
  Active = -1,
  Beside = -2,
  One = 1,
}

export enum TextEditorRevealType {
  Default = 0,
  InCenter = 1,
  InCenterIfOutsideViewport = 2,
  AtTop = 3,
}

/** A cancellation token the test can trigger (the notification's Cancel button). */
export class MockCancellationToken {
  isCancellationRequested = false;
  private readonly emitter = new EventEmitter<void>();
  readonly onCancellationRequested = this.emitter.event;
  cancel(): void {
    this.isCancellationRequested = true;
    this.emitter.fire();
  }
}

export interface MockProgress {
  options: { location: ProgressLocation; title?: string; cancellable?: boolean };
  reports: { message?: string; increment?: number }[];
  token: MockCancellationToken;
  done: boolean;
  result: Promise<unknown>;
}

export interface MockWebviewPanel {
  viewType: string;
  title: string;
  showOptions: unknown;
  options: Record<string, unknown>;
  webview: {
    html: string;
    cspSource: string;
    options: Record<string, unknown>;
    onDidReceiveMessage(l: Listener<unknown>): Disposable;
    /** Test helper: a message from the page's script. */
    receive(msg: unknown): void;
  };
  revealed: number;
  disposed: boolean;
  reveal(): void;
  onDidDispose(l: Listener<void>): Disposable;
  dispose(): void;
}

export interface MockTreeView {
  id: string;
  options: { treeDataProvider: unknown; showCollapseAll?: boolean };
  message: string | undefined;
  badge: { value: number; tooltip: string } | undefined;
  disposed: boolean;
  dispose(): void;
}

export enum StatusBarAlignment {
  Left = 1,
  Right = 2,
}

export interface MockOutputChannel {
  name: string;
  lines: string[];
  shown: number;
  disposed: boolean;
  text(): string;
}

export interface MockStatusBarItem {
  alignment: StatusBarAlignment;
  priority: number | undefined;
  name: string | undefined;
  text: string;
  tooltip: string | undefined;
  command: string | undefined;
  visible: boolean;
  disposed: boolean;
}

export interface MockState {
  commands: Map<string, (...args: unknown[]) => unknown>;
  /** Every commands.executeCommand call (setContext included). */
  executed: { id: string; args: unknown[] }[];
  /** Context keys set with setContext. */
  contexts: Map<string, unknown>;
  progress: MockProgress[];
  treeViews: MockTreeView[];
  panels: MockWebviewPanel[];
  /** Documents opened and editors shown (showTextDocument). */
  shownDocuments: { path: string; line: number | undefined; preview: boolean | undefined }[];
  /** Paths openTextDocument refuses (as for a file that does not exist). */
  missingFiles: Set<string>;
  /** What the next showInputBox resolves to, and the options it was called with. */
  inputBoxAnswer: string | undefined;
  inputBoxes: Record<string, unknown>[];
  /** Answer of showWarningMessage/showInformationMessage when given items (a button's title). */
  messageAnswer: string | undefined;
  /** Installed extensions by id (extensions.getExtension). */
  extensions: Map<string, { isActive: boolean; exports: unknown; activate(): Promise<unknown> }>;
  outputChannels: MockOutputChannel[];
  statusBarItems: MockStatusBarItem[];
  messages: { level: "info" | "warning" | "error"; text: string }[];
  /** Settings under the "ekka" section, e.g. { interpreter: "/usr/bin/python3" }. */
  settings: Record<string, unknown>;
  /** Resource-scoped overrides per workspace folder (its fsPath), read by getConfiguration("ekka", folderUri). */
  folderSettings: Map<string, Record<string, unknown>>;
  workspaceFolderListeners: Listener<unknown>[];
  configListeners: Listener<{ affectsConfiguration(section: string): boolean }>[];
  trustListeners: Listener<void>[];
}

export const mock: MockState = {
  commands: new Map(),
  executed: [],
  contexts: new Map(),
  progress: [],
  treeViews: [],
  panels: [],
  shownDocuments: [],
  missingFiles: new Set(),
  inputBoxAnswer: undefined,
  inputBoxes: [],
  messageAnswer: undefined,
  extensions: new Map(),
  outputChannels: [],
  statusBarItems: [],
  messages: [],
  settings: {},
  folderSettings: new Map(),
  workspaceFolderListeners: [],
  configListeners: [],
  trustListeners: [],
};

function createOutputChannel(name: string, _options?: { log: true }) {
  const ch: MockOutputChannel = {
    name,
    lines: [],
    shown: 0,
    disposed: false,
    text: () => ch.lines.join("\n"),
  };
  mock.outputChannels.push(ch);
  const log = (level: string) => (message: string) => {
    ch.lines.push(`[${level}] ${message}`);
  };
  return {
    name,
    trace: log("trace"),
    debug: log("debug"),
    info: log("info"),
    warn: log("warn"),
    error: log("error"),
    append: (v: string) => void ch.lines.push(v),
    appendLine: (v: string) => void ch.lines.push(v),
    show: () => void ch.shown++,
    hide: () => undefined,
    clear: () => void (ch.lines.length = 0),
    dispose: () => void (ch.disposed = true),
    mock: ch,
  };
}

function createStatusBarItem(alignment: StatusBarAlignment = StatusBarAlignment.Left, priority?: number) {
  const item: MockStatusBarItem & { show(): void; hide(): void; dispose(): void } = {
    alignment,
    priority,
    name: undefined,
    text: "",
    tooltip: undefined,
    command: undefined,
    visible: false,
    disposed: false,
    show() {
      item.visible = true;
    },
    hide() {
      item.visible = false;
    },
    dispose() {
      item.disposed = true;
    },
  };
  mock.statusBarItems.push(item);
  return item;
}

function message(level: "info" | "warning" | "error") {
  return (text: string, ...items: unknown[]): Promise<string | undefined> => {
    mock.messages.push({ level, text });
    const titles = items.filter((i): i is string => typeof i === "string");
    return Promise.resolve(mock.messageAnswer !== undefined && titles.includes(mock.messageAnswer) ? mock.messageAnswer : undefined);
  };
}

function withProgress<R>(
  options: MockProgress["options"],
  task: (progress: { report(v: { message?: string; increment?: number }) : void }, token: MockCancellationToken) => Thenable<R>,
): Thenable<R> {
  const token = new MockCancellationToken();
  const entry: MockProgress = { options, reports: [], token, done: false, result: Promise.resolve() };
  mock.progress.push(entry);
  const result = Promise.resolve(task({ report: (v) => void entry.reports.push(v) }, token)).finally(() => {
    entry.done = true;
  });
  entry.result = result;
  return result;
}

function createTreeView(id: string, options: MockTreeView["options"]): MockTreeView {
  const view: MockTreeView = {
    id,
    options,
    message: undefined,
    badge: undefined,
    disposed: false,
    dispose() {
      view.disposed = true;
    },
  };
  mock.treeViews.push(view);
  return view;
}

function createWebviewPanel(viewType: string, title: string, showOptions: unknown, options: Record<string, unknown>) {
  const messageListeners: Listener<unknown>[] = [];
  const disposeListeners: Listener<void>[] = [];
  const panel: MockWebviewPanel = {
    viewType,
    title,
    showOptions,
    options,
    webview: {
      html: "",
      cspSource: "https://mock.vscode-cdn.net",
      options,
      onDidReceiveMessage(l) {
        messageListeners.push(l);
        return new Disposable();
      },
      receive(msg) {
        for (const l of messageListeners) l(msg);
      },
    },
    revealed: 0,
    disposed: false,
    reveal() {
      panel.revealed++;
    },
    onDidDispose(l) {
      disposeListeners.push(l);
      return new Disposable();
    },
    dispose() {
      if (panel.disposed) return;
      panel.disposed = true;
      for (const l of disposeListeners) l();
    },
  };
  mock.panels.push(panel);
  return panel;
}

async function openTextDocument(uri: Uri) {
  if (mock.missingFiles.has(uri.fsPath)) {
    throw new Error(`cannot open ${uri.toString()}. Detail: Unable to read file (EntryNotFound)`);
  }
  return { uri };
}

async function showTextDocument(doc: { uri: Uri }, options?: { selection?: Range; preview?: boolean }) {
  mock.shownDocuments.push({ path: doc.uri.fsPath, line: options?.selection?.start.line, preview: options?.preview });
  return { document: doc, revealRange: () => undefined };
}

async function showInputBox(options: Record<string, unknown>): Promise<string | undefined> {
  mock.inputBoxes.push(options);
  return mock.inputBoxAnswer;
}

export const window: {
  activeTextEditor: { document: { uri: Uri } } | undefined;
  [key: string]: unknown;
} = {
  activeTextEditor: undefined,
  createOutputChannel,
  createStatusBarItem,
  showInformationMessage: message("info"),
  showWarningMessage: message("warning"),
  showErrorMessage: message("error"),
  withProgress,
  createTreeView,
  createWebviewPanel,
  showTextDocument,
  showInputBox,
};

export const commands = {
  registerCommand(id: string, handler: (...args: unknown[]) => unknown): Disposable {
    if (mock.commands.has(id)) {
      // Real VS Code throws here too: a command id can only be registered once.
      throw new Error(`command '${id}' already exists`);
    }
    mock.commands.set(id, handler);
    return new Disposable(() => mock.commands.delete(id));
  },
  executeCommand(id: string, ...args: unknown[]): Promise<unknown> {
    mock.executed.push({ id, args });
    if (id === "setContext") {
      mock.contexts.set(String(args[0]), args[1]);
      return Promise.resolve(undefined);
    }
    const handler = mock.commands.get(id);
    if (handler === undefined) {
      return Promise.reject(new Error(`command '${id}' not found`));
    }
    return Promise.resolve(handler(...args));
  },
};

export const workspace: {
  workspaceFolders: { uri: Uri; name: string; index: number }[] | undefined;
  /** workspace.isTrusted: true unless a test opens the workspace in Restricted Mode (then grantWorkspaceTrust). */
  isTrusted: boolean;
  [key: string]: unknown;
} = {
  workspaceFolders: undefined,
  isTrusted: true,
  openTextDocument,
  getConfiguration(section?: string, scope?: Uri | { uri: Uri }) {
    const prefix = section ? `${section}.` : "";
    const uri = scope instanceof Uri ? scope : scope?.uri;
    const folder = uri === undefined ? undefined : mock.folderSettings.get(uri.fsPath);
    const lookup = (key: string): unknown => {
      const full = prefix + key;
      if (!full.startsWith("ekka.")) return undefined;
      const name = full.slice("ekka.".length);
      return folder !== undefined && name in folder ? folder[name] : mock.settings[name];
    };
    return {
      get<T>(key: string, defaultValue?: T): T | undefined {
        const v = lookup(key);
        return v === undefined ? defaultValue : (v as T);
      },
      has: (key: string) => lookup(key) !== undefined,
    };
  },
  onDidChangeWorkspaceFolders(listener: Listener<unknown>): Disposable {
    mock.workspaceFolderListeners.push(listener);
    return new Disposable(() => {
      const i = mock.workspaceFolderListeners.indexOf(listener);
      if (i >= 0) mock.workspaceFolderListeners.splice(i, 1);
    });
  },
  onDidChangeConfiguration(listener: Listener<{ affectsConfiguration(section: string): boolean }>): Disposable {
    mock.configListeners.push(listener);
    return new Disposable(() => {
      const i = mock.configListeners.indexOf(listener);
      if (i >= 0) mock.configListeners.splice(i, 1);
    });
  },
  onDidGrantWorkspaceTrust(listener: Listener<void>): Disposable {
    mock.trustListeners.push(listener);
    return new Disposable(() => {
      const i = mock.trustListeners.indexOf(listener);
      if (i >= 0) mock.trustListeners.splice(i, 1);
    });
  },
};

/** Simulates the user trusting the workspace (Restricted Mode ends: onDidGrantWorkspaceTrust fires). */
export function grantWorkspaceTrust(): void {
  workspace.isTrusted = true;
  for (const listener of [...mock.trustListeners]) {
    listener();
  }
}

/** Simulates the user changing the named settings (keys without the "ekka." prefix). */
export function changeSettings(changes: Record<string, unknown>): void {
  Object.assign(mock.settings, changes);
  const changed = Object.keys(changes).map((k) => `ekka.${k}`);
  const event = {
    affectsConfiguration: (section: string) =>
      changed.some((c) => c === section || c.startsWith(`${section}.`) || section.startsWith(`${c}.`)),
  };
  for (const listener of [...mock.configListeners]) {
    listener(event);
  }
}

export const extensions = {
  getExtension(id: string) {
    return mock.extensions.get(id);
  },
};

/** SecretStorage in memory (ExtensionContext.secrets). */
export class MockSecretStorage {
  readonly values = new Map<string, string>();
  async get(key: string): Promise<string | undefined> {
    return this.values.get(key);
  }
  async store(key: string, value: string): Promise<void> {
    this.values.set(key, value);
  }
  async delete(key: string): Promise<void> {
    this.values.delete(key);
  }
}

export function resetVscodeMock(): void {
  mock.commands.clear();
  mock.executed.length = 0;
  mock.contexts.clear();
  mock.progress.length = 0;
  mock.treeViews.length = 0;
  mock.panels.length = 0;
  mock.shownDocuments.length = 0;
  mock.missingFiles.clear();
  mock.inputBoxAnswer = undefined;
  mock.inputBoxes.length = 0;
  mock.messageAnswer = undefined;
  mock.extensions.clear();
  mock.outputChannels.length = 0;
  mock.statusBarItems.length = 0;
  mock.messages.length = 0;
  mock.settings = {};
  mock.folderSettings.clear();
  mock.workspaceFolderListeners.length = 0;
  mock.configListeners.length = 0;
  mock.trustListeners.length = 0;
  window.activeTextEditor = undefined;
  workspace.workspaceFolders = undefined;
  workspace.isTrusted = true;
}

/** The object handed out for require("vscode"). */
export const vscodeModule = {
  Disposable,
  EventEmitter,
  Uri,
  Position,
  Range,
  ThemeColor,
  ThemeIcon,
  TreeItem,
  TreeItemCollapsibleState,
  ProgressLocation,
  ViewColumn,
  TextEditorRevealType,
  StatusBarAlignment,
  window,
  commands,
  workspace,
  extensions,
};
