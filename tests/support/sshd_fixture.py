"""A private OpenSSH server on 127.0.0.1 for the remote-execution tests.

Per run, in a temporary directory: an ed25519 host key, a user key (authorised) and a second user key (not
authorised), an ``authorized_keys``, a ``known_hosts`` naming the host key, and an ``sshd_config`` (free port,
``ListenAddress 127.0.0.1``, keys only, SFTP, pid file in the directory). ``/usr/sbin/sshd -D -f CONFIG -e`` runs
as a child of the test process and is stopped at teardown. ``scripts/install-sshd.sh`` installs the binary.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = Path(os.environ.get("EKKA_SSHD", "/usr/sbin/sshd"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keypair(path: Path) -> str:
    """Write an ed25519 private key at ``path`` (0600) and ``path.pub``; return the public key line."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519", comment=path.name)
    key.write_private_key(str(path))
    os.chmod(path, 0o600)
    pub = key.export_public_key().decode().strip()
    path.with_suffix(".pub").write_text(pub + "\n")
    return pub


@dataclass
class SSHServer:
    root: Path
    port: int = 0
    user: str = field(default_factory=lambda: os.environ.get("USER") or __import__("getpass").getuser())
    proc: subprocess.Popen | None = None

    @property
    def host_key(self) -> Path:
        return self.root / "host_ed25519"

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def wrong_key(self) -> Path:
        return self.root / "id_wrong"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def start(self) -> "SSHServer":
        self.root.mkdir(parents=True, exist_ok=True)
        host_pub = _keypair(self.host_key)
        user_pub = _keypair(self.client_key)
        _keypair(self.wrong_key)
        (self.root / "authorized_keys").write_text(user_pub + "\n")
        try:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)      # sshd's privilege-separation directory
        except OSError:
            pass                                                     # not root: sshd says what it lacks
        for attempt in range(5):
            self.port = _free_port()
            kh_type, kh_blob = host_pub.split()[:2]
            self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {kh_type} {kh_blob}\n")
            config = self.root / "sshd_config"
            config.write_text("\n".join([
                f"Port {self.port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {self.host_key}",
                f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                "StrictModes no",
                f"PidFile {self.root / 'sshd.pid'}",
                "UsePAM no",
                "PermitRootLogin yes",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "Subsystem sftp internal-sftp",
                "MaxStartups 50",
                "MaxSessions 20",
                "LogLevel VERBOSE",
                "",
            ]))
            log = open(self.log, "ab")
            self.proc = subprocess.Popen([str(SSHD), "-D", "-f", str(config), "-e"], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if self._wait_listening(10):
                return self
            self.stop()
        raise RuntimeError(f"sshd did not start; log:\n{self.log.read_text()[-2000:]}")

    def _wait_listening(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(8).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.1)
        return False

    def session_pids(self) -> list[int]:
        """PIDs of the sshd processes serving connections (descendants of the listener whose command is
        ``sshd: …``), not the commands those sessions run."""
        if self.proc is None:
            return []
        children: dict[int, list[int]] = {}
        cmdlines: dict[int, str] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                cmdlines[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
        out, todo = [], list(children.get(self.proc.pid, []))
        while todo:
            pid = todo.pop()
            if cmdlines.get(pid, "").startswith("sshd:"):
                out.append(pid)
                todo.extend(children.get(pid, []))
        return out

    def kill_sessions(self) -> list[int]:
        """SIGKILL every sshd process serving a connection: the clients see their connection drop, the commands
        they started lose their stdout/stderr but keep running."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def stop(self) -> None:
        if self.proc is None:
            return
        self.kill_sessions()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def processes_in_group(pgid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command) of the live processes whose process group is ``pgid`` (from /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            rest = stat.rsplit(")", 1)[1].split()
            state, pgrp = rest[0], int(rest[2])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except (OSError, IndexError, ValueError):
            continue
        if pgrp == pgid:
            found.append((int(d.name), state, cmd))
    return found
