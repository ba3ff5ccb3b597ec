#!/usr/bin/env bash
# End-to-end test of the VS Code extension in real VS Code (code-server 4.100.3 in headless Debian Chromium,
# driven by playwright-core): set up (scripts/e2e-setup.sh, a no-op once done), package the .vsix (bundled
# Python server included), then run tests/e2e/vscode.e2e.mjs, which installs that .vsix into a fresh
# extensions dir and diagnoses the demo spec through the UI. Screenshots: build/e2e/screenshots/ (EKKA_E2E_SCREENSHOTS=media refreshes media/e2e-*.png).
#
#   bash scripts/e2e.sh            (also: npm run test:e2e)
#
# Environment: EKKA_E2E_DIR (tools, default build/e2e), EKKA_E2E_KEEP=1 keeps the temporary workspace and logs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$SECONDS
say() { printf '[e2e] %s\n' "$*" >&2; }

[ -x .venv/bin/python ] || { say "no .venv: run scripts/setup.sh first"; exit 2; }
[ -d node_modules/playwright-core ] || { say "node modules missing: run npm ci (or scripts/setup.sh)"; exit 2; }

bash scripts/e2e-setup.sh
say "packaging the extension (npm run package)"
npm run package --workspace extension --silent >/dev/null
[ -f extension/ekka.vsix ] || { say "extension/ekka.vsix was not built"; exit 2; }
say "setup and packaging took $((SECONDS - start)) s"

node tests/e2e/vscode.e2e.mjs
say "total $((SECONDS - start)) s"
