#!/usr/bin/env bash
# Sets up what the end-to-end test of the VS Code extension needs (scripts/e2e.mjs): real VS Code in the browser
# (code-server 4.100.3, the last release for Node 20) and headless Debian Chromium. Follows
# /work/shared/reference/code-server-recipe.md: no binary downloads from GitHub, never `playwright install`.
#
#   bash scripts/e2e-setup.sh          # idempotent: a fast no-op once installed (stamp file)
#
# Installs into $EKKA_E2E_DIR (default: build/e2e, git-ignored). System packages come from apt (needs root the
# first time). playwright-core itself is an npm devDependency of the repository (npm ci).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
e2e_dir="${EKKA_E2E_DIR:-$root/build/e2e}"
version="4.100.3"
stamp="$e2e_dir/.ekka-e2e-setup"
want="code-server@$version recipe-1"

say() { printf '[e2e-setup] %s\n' "$*" >&2; }
die() { printf '[e2e-setup] error: %s\n' "$*" >&2; exit 2; }

cs="$e2e_dir/node_modules/code-server"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$e2e_dir/node_modules/.bin/code-server" ] \
    && command -v chromium >/dev/null 2>&1; then
  say "code-server $version and chromium already set up ($e2e_dir)"
  exit 0
fi

node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
[ "$node_major" = 20 ] || die "code-server $version needs Node 20 (found $(node --version 2>/dev/null || echo none))"

# 1. system packages: headers for the native modules, ripgrep (instead of the GitHub download), chromium.
pkgs=(libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev pkg-config ripgrep chromium build-essential python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing system packages (${missing[*]}); as root: apt-get install -y ${missing[*]}"
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ -x /usr/include/node ] || [ -d /usr/include/node ] || die "Node headers missing (/usr/include/node): install nodejs's headers (Debian: libnode-dev)"

# 2. code-server itself, without its postinstall (it downloads, and refuses root).
export npm_config_unsafe_perm=true npm_config_nodedir=/usr npm_config_yes=true npm_config_audit=false \
  npm_config_fund=false npm_config_update_notifier=false
mkdir -p "$e2e_dir"
cd "$e2e_dir"
[ -f package.json ] || echo '{"name":"ekka-e2e-tools","private":true}' > package.json
say "npm install --ignore-scripts code-server@$version (in $e2e_dir)"
npm install --ignore-scripts --no-save "code-server@$version" >/dev/null
say "npm rebuild argon2"
npm rebuild argon2 >/dev/null

# 3. what code-server's postinstall.sh would do, minus the downloads.
cd "$cs/lib/vscode"
say "installing VS Code's server dependencies (npm install --omit=dev, a few minutes)"
npm install --ignore-scripts --omit=dev >/dev/null
mkdir -p node_modules/@vscode/ripgrep/bin
ln -sf "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg
say "building native modules (npm rebuild)"
npm rebuild >/dev/null
ln -sfn node_modules node_modules.asar
(cd bin/remote-cli && ln -sf code-linux.sh code-server)
(cd bin/helpers && ln -sf browser-linux.sh browser.sh)
say "installing the built-in extensions' dependencies"
(cd extensions && npm install --omit=dev >/dev/null)

"$e2e_dir/node_modules/.bin/code-server" --version >/dev/null || die "code-server does not run (see above)"
echo "$want" > "$stamp"
say "ready: $e2e_dir/node_modules/.bin/code-server ($("$e2e_dir/node_modules/.bin/code-server" --version | head -1))"
