#!/usr/bin/env bash
# Fetch SGLang's model sources for static parsing (ekka_core/tree/static/) WITHOUT installing sglang: download
# the sglang wheel alone (pip download --no-deps, from PyPI) and extract only the requested files.
#
#   scripts/fetch_sglang_sources.sh [VERSION] [MEMBER_GLOB ...]
#
# VERSION defaults to $EKKA_SGLANG_VERSION, else 0.5.23 (pinned so that every machine parses the same source).
# MEMBER_GLOBs are paths inside the wheel; default: sglang/srt/models/llama.py sglang/srt/models/qwen2.py
# (e.g. 'sglang/srt/models/*.py' for every model).
#
# Output: the source root on stdout (a directory holding sglang/…: pass it as a search path to
# locate_source_of / StaticIndex). Layout: .ekka-cache/sglang-src/VERSION/{sglang/…, wheel/*.whl}
# ($EKKA_SGLANG_SRC_DIR replaces .ekka-cache/sglang-src). When every requested member is already extracted
# nothing is downloaded; the wheel is kept so further members extract without the network.
# Exit codes: 0 ok · 2 bad arguments · 3 download or extraction failed (the reason is printed on stderr).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '[fetch-sglang] %s\n' "$*" >&2; }
die() { local code="$1"; shift; printf '[fetch-sglang] error: %s\n' "$*" >&2; exit "$code"; }

version="${1:-${EKKA_SGLANG_VERSION:-0.5.23}}"
[[ "$version" =~ ^[0-9][0-9A-Za-z.+!-]*$ ]] || die 2 "VERSION must be a release number such as 0.5.23 (got '$version')"
shift || true
members=("$@")
[ "${#members[@]}" -gt 0 ] || members=(sglang/srt/models/llama.py sglang/srt/models/qwen2.py)

cache="${EKKA_SGLANG_SRC_DIR:-$root/.ekka-cache/sglang-src}/$version"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python="python3"; fi
fi

missing=0
for m in "${members[@]}"; do
  # a glob counts as present when it matches at least one extracted file
  compgen -G "$cache/$m" >/dev/null || { missing=1; break; }
done
if [ "$missing" = 0 ]; then
  say "cached: sglang $version sources in $cache"
  printf '%s\n' "$cache"
  exit 0
fi

mkdir -p "$cache/wheel"
wheel="$(ls "$cache"/wheel/sglang-"$version"-*.whl 2>/dev/null | head -1 || true)"
if [ -z "$wheel" ]; then
  log="$cache/wheel/pip-download.log"
  say "downloading the sglang $version wheel (no dependencies, not installed)"
  pip_dl=("$python" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: -d "$cache/wheel")
  if ! "${pip_dl[@]}" "sglang==$version" >"$log" 2>&1; then
    # No wheel for this interpreter/platform: the Python sources are the same in every wheel, take the x86-64
    # CPython 3.11 one.
    say "no wheel for this interpreter; retrying for manylinux x86_64 / CPython 3.11"
    "${pip_dl[@]}" --platform manylinux_2_34_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
        "sglang==$version" >>"$log" 2>&1 || {
      reason="$(grep -E 'ERROR|No matching distribution|Could not|HTTPSConnectionPool|Failed to' "$log" | head -3 | tr '\n' ' ')"
      die 3 "pip could not download sglang==$version: ${reason:-see $log} (full log: $log)"
    }
  fi
  wheel="$(ls "$cache"/wheel/sglang-"$version"-*.whl 2>/dev/null | head -1 || true)"
  [ -n "$wheel" ] || die 3 "pip reported success but left no sglang-$version wheel in $cache/wheel (log: $log)"
fi

"$python" - "$wheel" "$cache" "${members[@]}" <<'PY' || die 3 "could not extract the requested files from $wheel"
import fnmatch, os, sys, zipfile
wheel, dest, patterns = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as zf:
    names = [n for n in zf.namelist() if not n.endswith("/")]
    for pat in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            sys.exit(f"[fetch-sglang] error: no file in {os.path.basename(wheel)} matches {pat!r}")
        for n in hits:
            target = os.path.realpath(os.path.join(dest, n))
            if not target.startswith(os.path.realpath(dest) + os.sep):
                sys.exit(f"[fetch-sglang] error: unsafe path in wheel: {n!r}")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = target + ".part"
            with zf.open(n) as src, open(tmp, "wb") as out:
                out.write(src.read())
            os.replace(tmp, target)
PY
printf '%s\n' "$(basename "$wheel")" > "$cache/WHEEL"
say "extracted ${members[*]} from $(basename "$wheel") into $cache"
printf '%s\n' "$cache"
