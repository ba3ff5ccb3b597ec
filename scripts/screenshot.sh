#!/usr/bin/env bash
# Screenshot of the demo diagnosis' HTML report → media/report.png (headless Debian chromium, no network).
#
#   bash scripts/screenshot.sh [REPORT_HTML] [OUT_PNG]
#
# Without REPORT_HTML it runs the demo (`.venv/bin/ekka demo --out /tmp/demo-shot`, exit code 1 = divergent, the
# expected verdict) and shoots /tmp/demo-shot/report.html. Installs chromium with apt-get when it is missing
# (needs root). Window 1280x1400: the verdict, the suspects table, the error-ratio plot and the heat map.
set -euo pipefail
cd "$(dirname "$0")/.."

report="${1:-}"
out="${2:-media/report.png}"

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "chromium is missing; install it as root: apt-get update && apt-get install -y chromium" >&2
    exit 2
  fi
  apt-get update
  apt-get install -y --no-install-recommends chromium fonts-dejavu-core
fi

if [ -z "$report" ]; then
  demo_out=/tmp/demo-shot
  set +e
  .venv/bin/ekka demo --out "$demo_out"
  rc=$?
  set -e
  if [ "$rc" -ge 2 ]; then
    echo "ekka demo failed (exit $rc)" >&2
    exit "$rc"
  fi
  report="$demo_out/report.html"
fi
[ -f "$report" ] || { echo "no report at $report" >&2; exit 2; }

mkdir -p "$(dirname "$out")"
rm -f "$out"
profile="$(mktemp -d)"
log="$(mktemp)"
trap 'rm -rf "$profile" "$log"' EXIT
# chromium logs D-Bus noise on a headless box; show its log only when it fails.
if ! chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" \
  --window-size=1280,1400 --screenshot="$(realpath -m "$out")" "file://$(realpath "$report")" >"$log" 2>&1 \
  || [ ! -s "$out" ]; then
  cat "$log" >&2
  echo "chromium could not take the screenshot" >&2
  exit 3
fi
echo "wrote $out"
