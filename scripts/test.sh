#!/usr/bin/env bash
# Run every test: the Python suite (pytest, extra arguments passed through) and the extension's (npm test).
# Sets up the environment first (scripts/setup.sh: a fast no-op when nothing changed). Both suites always run,
# one after the other; the exit status is non-zero if either failed. pytest collecting no tests counts as failure.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { printf '[test] %s\n' "$*" >&2; }

bash scripts/setup.sh || { say "setup failed (exit $?): no tests were run"; exit 2; }
# System services the tests start themselves: a real OpenSSH server (remote execution tests).
bash scripts/install-sshd.sh || { say "could not install openssh-server: no tests were run"; exit 2; }

start=$SECONDS
# Two workers by default (the CI machine has 2 cores; engine runs are mostly single-threaded Python): whole files
# per worker, so a module's fixtures (a traced run shared by its tests) are computed once; the session's clean zoo
# diagnoses are shared between workers through a lock (tests/conftest.py). EKKA_TEST_WORKERS=0 runs in-process.
workers="${EKKA_TEST_WORKERS:-2}"
dist=()
[ "$workers" != "0" ] && dist=(-n "$workers" --dist loadfile)
.venv/bin/python -m pytest -q --durations=30 "${dist[@]}" "$@"
py_rc=$?
py_s=$((SECONDS - start))
case "$py_rc" in
  0) py_status="passed" ;;
  5) py_status="FAILED (no tests were collected: check the arguments / -k expression / testpaths)" ;;
  *) py_status="FAILED (exit $py_rc)" ;;
esac
[ "$py_rc" -eq 5 ] && say "pytest collected no tests: treating this as a failure"

start=$SECONDS
npm test
npm_rc=$?
# End-to-end in real VS Code (code-server in headless Chromium); scripts/e2e-setup.sh installs what it needs.
if [ "$npm_rc" -eq 0 ]; then
  bash scripts/e2e-setup.sh && npm run test:e2e
  npm_rc=$?
fi
npm_s=$((SECONDS - start))
if [ "$npm_rc" -eq 0 ]; then npm_status="passed"; else npm_status="FAILED (exit $npm_rc)"; fi

if [ "$py_rc" -eq 0 ] && [ "$npm_rc" -eq 0 ]; then
  say "summary: OK — pytest $py_status in ${py_s}s; npm test $npm_status in ${npm_s}s"
  exit 0
fi
say "summary: FAILED — pytest $py_status in ${py_s}s; npm test $npm_status in ${npm_s}s"
exit 1
