#!/usr/bin/env bash
# Make sure an OpenSSH server binary exists at /usr/sbin/sshd: the remote-execution tests (tests/remote/test_remote.py)
# start a private sshd on 127.0.0.1 with a throw-away config, host key and user key (tests/support/sshd_fixture.py).
# Nothing is enabled or started as a system service: only the package is installed (Debian/Ubuntu: apt-get).
# A fast no-op when sshd is already there. Exit 0 when sshd is available afterwards, 2 otherwise.
set -uo pipefail

say() { printf '[install-sshd] %s\n' "$*" >&2; }

sshd="${EKKA_SSHD:-/usr/sbin/sshd}"
if [ -x "$sshd" ]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  say "no $sshd and no apt-get: install the OpenSSH server with your package manager (the remote tests are skipped without it)"
  exit 2
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo=(sudo -n); else
    say "no $sshd, and not root (no sudo): run 'apt-get install openssh-server' as root"; exit 2
  fi
fi

say "installing openssh-server (apt-get; the package's service is not started)"
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101 keeps the package's postinst from starting the system sshd in containers and CI machines.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ] && [ "$(id -u)" -eq 0 ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
fi
log="$(mktemp -t install-sshd.XXXXXX.log)"
rc=0
"${sudo[@]}" apt-get install -y --no-install-recommends openssh-server >"$log" 2>&1 || {
  "${sudo[@]}" apt-get update >>"$log" 2>&1
  "${sudo[@]}" apt-get install -y --no-install-recommends openssh-server >>"$log" 2>&1 || rc=$?
}
[ "$created_policy" -eq 1 ] && rm -f "$policy"
if [ "$rc" -ne 0 ] || [ ! -x "$sshd" ]; then
  say "apt-get could not install openssh-server (exit $rc); last lines of $log:"
  tail -n 5 "$log" >&2
  exit 2
fi
rm -f "$log"
say "installed $("$sshd" -V 2>&1 | head -1 || echo sshd)"
exit 0
