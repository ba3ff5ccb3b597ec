"""Diagnosis jobs: the record the editor sees, and the engine process that does the work.

A job runs as an asyncio task in the language server's event loop (never on pygls's thread pool, which also
reads stdin). Its heavy work happens in ``<interpreter> -m server.engine_process``, started in a new session so
that cancelling kills it and every process it started (the engine's capture subprocesses) at once. A failure
arrives as the error envelope and is raised here as the :class:`~ekka_core.contracts.errors.EkkaError` it was; a
result arrives as JSON and is read here, once, into a :class:`WorkerResult` holding the typed report.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from ekka_core.contracts.errors import BadInput, InternalFailure
from ekka_core.contracts.jsonable import from_json
from ekka_core.contracts.report import Report, TargetLocation
from server.protocol import decode, encode, worker_failure

# The directory holding the `server` package: put on the worker's PYTHONPATH so `-m server.engine_process` resolves
# whatever the worker interpreter's working directory and installed packages are.
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
LINE_LIMIT = 512 << 20   # one response line carries the whole report (plots included)


@dataclass
class Job:
    id: str
    workspace: str
    uri: str | None
    out_dir: str | None = None
    state: str = "queued"
    stage: str | None = None
    percent: int = 0
    message: str = ""
    pid: int | None = None
    exit_code: int | None = None
    error: dict[str, Any] | None = None
    verdict: str | None = None
    token: str | None = None
    cancel_requested: bool = False
    remote: bool = False               # runs on an ssh:// executor: cancelling must stop the host's run first
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex[:8]

    def record(self) -> dict[str, Any]:
        return {"jobId": self.id, "state": self.state, "stage": self.stage, "percent": self.percent,
                "message": self.message, "uri": self.uri, "out_dir": self.out_dir, "pid": self.pid,
                "exit_code": self.exit_code, "error": self.error, "verdict": self.verdict}


@dataclass
class WorkerResult:
    """The engine process's answer to ``diagnose`` (server.protocol), read once at the process boundary."""

    report: Report
    paths: dict[str, str] = field(default_factory=dict)            # json, md, html (and more for a remote run)
    # Where the class of every module the report names is defined (the target trace's index), not only suspects'.
    modules: dict[str, TargetLocation] = field(default_factory=dict)

    @staticmethod
    def from_json(result: Any) -> "WorkerResult":
        """The ``result`` member as the worker sent it; a report this server cannot read is an internal failure
        (the worker's Ekka is another version than the server's)."""
        result = result if isinstance(result, dict) else {}
        try:
            report = Report.from_json(result["report"])
            modules = {str(m): from_json(TargetLocation, {**loc, "module": m})
                       for m, loc in (result.get("modules") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InternalFailure(f"the Ekka worker sent a report this server cannot read ({type(e).__name__}: {e})",
                                  fix="give `ekka.interpreter` a Python with the same Ekka version as the editor's "
                                      "server") from None
        return WorkerResult(report, paths={str(k): str(v) for k, v in (result.get("paths") or {}).items()},
                            modules=modules)


def kill_session(pid: int) -> None:
    """SIGKILL the worker's process group, then anything else left in its session (a child that moved to a
    process group of its own). The worker was started with start_new_session, so pid = pgid = sid."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for other in session_members(pid):
        try:
            os.kill(other, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def session_members(sid: int, *, include_zombies: bool = False) -> list[int]:
    """Processes whose session id is ``sid`` (Linux /proc; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()   # state ppid pgrp session ...
        if len(fields) > 3 and fields[3] == str(sid) and (include_zombies or fields[0] not in ("Z", "X")):
            found.append(int(entry))
    return found


class WorkerProcess:
    """One engine process for one job: spawn, one ``diagnose`` request, progress callbacks, result."""

    def __init__(self, interpreter: str, cwd: str | None, on_log: Callable[[str], None] = lambda line: None):
        self.interpreter = interpreter
        self.cwd = cwd
        self.on_log = on_log
        self.proc: asyncio.subprocess.Process | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._pump: asyncio.Task | None = None

    async def start(self) -> asyncio.subprocess.Process:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["PYTHONUNBUFFERED"] = "1"
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.interpreter, "-m", "server.engine_process", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=self.cwd, env=env,
                start_new_session=True, limit=LINE_LIMIT)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
            raise BadInput(f"cannot start the Ekka worker with interpreter {self.interpreter!r} ({e})",
                           fix="set `ekka.interpreter` to a Python that has Ekka, torch and the engine installed") \
                from None
        self._pump = asyncio.create_task(self._read_stderr())
        return self.proc

    async def _read_stderr(self) -> None:
        assert self.proc and self.proc.stderr
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.stderr_tail.append(text)
            self.on_log(text)

    async def diagnose(self, params: dict[str, Any],
                       on_progress: Callable[[dict[str, Any]], Awaitable[None] | None]) -> WorkerResult:
        """Send the request and read until its response. Raises the EkkaError the engine process reported; EOF
        (the process died or was killed) is an InternalFailure."""
        assert self.proc and self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(encode({"id": 1, "method": "diagnose", "params": params}))
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass   # the worker is already gone: reading below hits EOF and reports its exit code and log
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                code = await self.wait()
                if self._pump:
                    await asyncio.wait([self._pump], timeout=2)
                tail = "\n".join(list(self.stderr_tail)[-8:])
                raise InternalFailure(f"the Ekka worker stopped unexpectedly (exit code {code})"
                                      + (f":\n{tail}" if tail else ""), fix="see the Ekka output for the worker's log")
            try:
                msg = decode(line)
            except ValueError:
                self.on_log(f"(unparsable worker output) {line[:200]!r}")
                continue
            if msg.get("method") == "progress":
                maybe = on_progress(msg.get("params") or {})
                if asyncio.iscoroutine(maybe):
                    await maybe
            elif msg.get("id") == 1:
                if "error" in msg:
                    raise worker_failure(msg["error"])
                return WorkerResult.from_json(msg.get("result"))

    async def close(self, timeout: float = 5.0) -> None:
        """End the worker: EOF on its stdin, then the whole session if it does not exit in time."""
        if self.proc is None:
            return
        if self.proc.returncode is None and self.proc.stdin and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self.kill()
        await self.wait()

    def kill(self) -> None:
        if self.proc is not None:
            kill_session(self.proc.pid)

    async def wait(self) -> int | None:
        if self.proc is None:
            return None
        return await self.proc.wait()


REMOTE_CANCEL_GRACE_S = 15


def kill_if_alive(proc: Any) -> None:
    if proc.returncode is None:
        kill_session(proc.pid)
