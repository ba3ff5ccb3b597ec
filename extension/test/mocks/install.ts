// Serves mocks for modules that only exist inside VS Code ('vscode') or that need it ('vscode-languageclient/node').
// The test bundles keep those imports external (see esbuild.mjs), so each becomes a runtime require() that
// Module._load can answer. Call installModuleMocks() before require()-ing code that imports them.
import Module = require("node:module");

type Loader = (request: string, parent: unknown, isMain: boolean) => unknown;
const moduleWithLoad = Module as unknown as { _load: Loader };

let originalLoad: Loader | undefined;

export function installModuleMocks(mocks: Record<string, unknown>): void {
  if (originalLoad !== undefined) {
    throw new Error("module mocks are already installed");
  }
  const load = moduleWithLoad._load;
  originalLoad = load;
  moduleWithLoad._load = function (this: unknown, request: string, parent: unknown, isMain: boolean): unknown {
    if (Object.prototype.hasOwnProperty.call(mocks, request)) {
      return mocks[request];
    }
    return load.call(this, request, parent, isMain);
  };
}

export function uninstallModuleMocks(): void {
  if (originalLoad !== undefined) {
    moduleWithLoad._load = originalLoad;
    originalLoad = undefined;
  }
}
