"""The engine process: runs :func:`ekka_core.pipeline.diagnose` for the language server.

``<interpreter> -m server.engine_process`` speaks newline-delimited JSON-RPC 2.0 on stdin/stdout (see
:mod:`server.protocol`). It is the only process of the editor integration that imports torch, vLLM and
transformers; the language server starts it in a new session and kills the whole process group to cancel,
which also ends the capture subprocesses the engine starts.

stdout is the protocol channel: the original stdout is kept for messages and file descriptor 1 is pointed at
stderr, so anything the engine or a library prints lands in the log instead of corrupting the protocol.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO, Callable

from ekka_core.contracts.env import check_ekka_env
from ekka_core.contracts.errors import BadInput, EkkaError, InternalFailure
from ekka_core.contracts.report import Report
from ekka_core.contracts.trace_index import TraceIndex
from server.protocol import decode, encode, heavy_modules, stage_percent, worker_error


class Worker:
    def __init__(self, out: BinaryIO):
        self.out = out

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(encode(message))
        self.out.flush()

    def serve(self, inp: BinaryIO) -> None:
        for raw in inp:
            if not raw.strip():
                continue
            try:
                msg = decode(raw)
            except ValueError as e:
                self.send({"id": None, "error": {"code": -32700, "message": f"parse error: {e}"}})
                continue
            method, msg_id, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
            if method == "exit":
                return
            handler: Callable[[Any, dict[str, Any]], Any] | None = {
                "diagnose": self.diagnose, "ping": self.ping}.get(method)  # type: ignore[arg-type]
            if handler is None:
                if msg_id is not None:
                    self.send({"id": msg_id, "error": {"code": -32601, "message": f"unknown method {method!r}"}})
                continue
            try:
                self.send({"id": msg_id, "result": handler(msg_id, params)})
            except BaseException as e:  # noqa: BLE001 - every failure becomes an error response
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                self.send({"id": msg_id, "error": _error(e)})

    def ping(self, msg_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        return {"pid": os.getpid(), "python": sys.executable, "heavy_modules": heavy_modules()}

    def diagnose(self, msg_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        from ekka_core.contracts.spec import DiagnosisSpec

        fields = params.get("spec")
        if not isinstance(fields, dict):
            raise BadInput("the diagnose request has no spec", fix="pass a spec file, a repro script or spec fields")
        spec = DiagnosisSpec.from_json(fields, where="the diagnose request's spec")
        executor = params.get("executor")
        if executor is None:
            spec.validate()       # bad input fails here, before the heavy imports below
        # (with a remote executor the model path is a path on that host: the remote run validates it there)
        out_dir = params.get("out_dir")
        if not out_dir:
            raise BadInput("no output directory given", fix="pass out_dir")
        env = params.get("env") or None
        problem = check_ekka_env(env)
        if problem:
            raise BadInput(f"env {problem}", fix="pass only EKKA_* variables in env")

        seen: dict[str, int] = {}

        def progress(stage: str, message: str) -> None:
            n = seen.get(stage, 0)
            seen[stage] = n + 1
            self.send({"method": "progress", "params": {"id": msg_id, "stage": stage, "message": message,
                                                        "percent": stage_percent(stage, n)}})

        if executor is None:
            from ekka_core.pipeline import diagnose
            result = diagnose(spec, Path(out_dir), fresh=bool(params.get("fresh")), progress=progress, env=env)
        else:
            from ekka_core.remote import DEFAULT_REMOTE_PYTHON, DEFAULT_REMOTE_WORKDIR, run_remote_diagnosis

            # Capture and analysis run on the host (tensors stay there); only the report comes back. The server
            # cancels with SIGUSR1: the remote process group is killed over SSH before this worker exits.
            cancel = threading.Event()
            signal.signal(signal.SIGUSR1, lambda *_: cancel.set())
            result = run_remote_diagnosis(spec, executor["url"],
                                          remote_python=executor.get("python") or DEFAULT_REMOTE_PYTHON,
                                          remote_workdir=executor.get("workdir") or DEFAULT_REMOTE_WORKDIR,
                                          out_dir_local=Path(out_dir), fresh=bool(params.get("fresh")),
                                          progress=progress, env=env, cancel_event=cancel)
        return {"report": result.report.to_json(), "paths": {k: str(v) for k, v in result.paths.items()},
                "modules": _modules(result.report)}


def _error(e: BaseException) -> dict[str, Any]:
    if isinstance(e, EkkaError):
        return worker_error(e)
    tb = traceback.format_exc()
    print(tb, file=sys.stderr, flush=True)
    return worker_error(InternalFailure(f"internal error: {type(e).__name__}: {e}",
                                        fix="see the Ekka output for the traceback"), traceback=tb)


def _modules(report: Report) -> dict[str, dict[str, Any]]:
    """Class source location of every module the report names (series and suspects), read from the target
    trace's index (plain JSON): the editor finds the class lines of all compared modules, not only suspects."""
    wanted = {p.component for p in report.plots.series} | {s.target.module for s in report.suspects}
    traces = report.meta.traces
    out: dict[str, dict[str, Any]] = {}
    if not traces:
        return out
    try:
        index = TraceIndex(Path(traces) / "target")
    except (EkkaError, OSError, KeyError, TypeError):
        return out
    for call in index.calls:
        if call.module in wanted and call.module not in out and call.class_file:
            out[call.module] = {"class": call.cls, "file": call.class_file, "line": call.class_line,
                                "forward_file": call.forward_file, "forward_line": call.forward_line}
    return out


def _watch_parent(parent: int) -> None:
    """If the language server dies without cancelling (crash, SIGKILL), end this worker's whole process group:
    an orphaned capture must not keep the machine busy. The worker is its session's leader (pgid = pid)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def main() -> int:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # stray prints (engine, libraries) go to the log
    if os.getpgrp() == os.getpid():                      # started in its own session, as the server does
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    Worker(proto).serve(sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
