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
  outputChannels: MockOutputChannel[];
  statusBarItems: MockStatusBarItem[];
  messages: { level: "info" | "warning" | "error"; text: string }[];
  /** Settings under the "ekka" section, e.g. { interpreter: "/usr/bin/python3" }. */
  settings: Record<string, unknown>;
  configListeners: Listener<{ affectsConfiguration(section: string): boolean }>[];
}

export const mock: MockState = {
  commands: new Map(),
  outputChannels: [],
  statusBarItems: [],
  messages: [],
  settings: {},
  configListeners: [],
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
  return (text: string): Promise<undefined> => {
    mock.messages.push({ level, text });
    return Promise.resolve(undefined);
  };
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
    const handler = mock.commands.get(id);
    if (handler === undefined) {
      return Promise.reject(new Error(`command '${id}' not found`));
    }
    return Promise.resolve(handler(...args));
  },
};

export const workspace: {
  workspaceFolders: { uri: Uri; name: string; index: number }[] | undefined;
  [key: string]: unknown;
} = {
  workspaceFolders: undefined,
  getConfiguration(section?: string) {
    const prefix = section ? `${section}.` : "";
    const lookup = (key: string): unknown => {
      const full = prefix + key;
      return full.startsWith("ekka.") ? mock.settings[full.slice("ekka.".length)] : undefined;
    };
    return {
      get<T>(key: string, defaultValue?: T): T | undefined {
        const v = lookup(key);
        return v === undefined ? defaultValue : (v as T);
      },
      has: (key: string) => lookup(key) !== undefined,
    };
  },
  onDidChangeConfiguration(listener: Listener<{ affectsConfiguration(section: string): boolean }>): Disposable {
    mock.configListeners.push(listener);
    return new Disposable(() => {
      const i = mock.configListeners.indexOf(listener);
      if (i >= 0) mock.configListeners.splice(i, 1);
    });
  },
};

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

export function resetVscodeMock(): void {
  mock.commands.clear();
  mock.outputChannels.length = 0;
  mock.statusBarItems.length = 0;
  mock.messages.length = 0;
  mock.settings = {};
  mock.configListeners.length = 0;
  window.activeTextEditor = undefined;
  workspace.workspaceFolders = undefined;
}

/** The object handed out for require("vscode"). */
export const vscodeModule = {
  Disposable,
  Uri,
  StatusBarAlignment,
  window,
  commands,
  workspace,
};
