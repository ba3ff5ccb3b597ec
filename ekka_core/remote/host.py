"""``python -m ekka_core.remote.host`` — the host half of a remote diagnosis (runs on the GPU host).

Started over SSH by :mod:`ekka_core.remote.client` with the deployed engine (extracted) on ``PYTHONPATH`` and the host's own
torch / vLLM / SGLang. Reads one JSON job line on stdin::

    {"protocol": 1, "spec": {...DiagnosisSpec...}, "out_dir": "/abs/remote/dir", "fresh": false, "env": {...}}

runs :func:`ekka_core.pipeline.diagnose` there (capture *and* analysis: tensors never leave the host) and writes
one JSON event per line on stdout:

* ``{"event": "hello", "pid", "pgid", "python", "ekka_file", ...}`` — first, before any heavy import; ``pgid`` is
  the process group the client kills on cancel (the host process makes itself a session leader: ``setsid``);
* ``{"event": "progress", "stage", "message"}`` — the pipeline's progress (stages of ``ekka_core.STAGES``);
* ``{"event": "done", "results", "results_bytes", "verdict", "trace_bytes", ...}`` — ``results`` is a small zip of
  report.json/md/html, mapping.json, the agent transcript if any, and summary.json for the client to fetch (never
  traces);
* ``{"event": "error", "message", "fix", "exit_code", "traceback"?}`` — the error envelope
  (:meth:`~ekka_core.contracts.errors.EkkaError.to_json`) of an EkkaError, or of a crash as an internal failure.

A lost connection does not stop the run: the host process notices its stdout is gone, keeps writing events to
``OUT/.ekka-remote/events.jsonl`` only, and finishes the diagnosis, so its traces are complete for the next run.
Runs on one output directory are serialised by a lock file; a second run waits for the first, then reuses its traces.
Imports nothing but the standard library and the torch-free contracts until the job is read (the hello must be
fast).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any

from ekka_core.contracts.errors import EkkaError, InternalFailure, internal_error

PROTOCOL = 1
STATE_DIR = ".ekka-remote"
RESULTS = "results.zip"
# The mapping agent's transcript comes back too when a session called the API (ekka_core.agent.transcript's JSONL
# and MARKDOWN, spelled out: this module imports only the standard library before the job is read).
# report.md and report.html are not sent: the client renders them from report.json with the same code, after adding
# what only it knows (meta.remote) — fewer bytes on the wire, and the three files agree.
RESULT_FILES = ("report.json", "mapping.json", "agent-transcript.jsonl", "agent-transcript.md")
LOG_TAIL = 4000


class _Events:
    """JSON lines to stdout while someone reads them, and always to the run's events.jsonl once it is known."""

    def __init__(self) -> None:
        self.detached = False
        self.log: Any = None

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "t": round(time.time(), 3), **fields})
        if self.log is not None:
            self.log.write(line + "\n")
            self.log.flush()
        if self.detached:
            return
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except OSError:              # BrokenPipeError: the SSH connection is gone; finish the run regardless
            self._detach()

    def _detach(self) -> None:
        self.detached = True
        target = self.log.fileno() if self.log is not None else os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):            # later writes (warnings, logging, the interpreter's exit flush) must not fail
            try:
                os.dup2(target, fd)
            except OSError:
                pass
        try:
            sys.stdout = open(os.devnull, "w")   # drop what the broken buffer still holds
        except OSError:
            pass


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _tail(path: Path, n: int = LOG_TAIL) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _lock(state: Path, events: _Events) -> Any:
    import fcntl

    handle = open(state / "lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            other = json.loads((state / "pid").read_text()).get("pid")
        except (OSError, ValueError):
            other = "?"
        events.emit("progress", stage="capture",
                    message=f"waiting for an earlier run on this output directory to finish (pid {other}); "
                            "its traces will be reused")
        fcntl.flock(handle, fcntl.LOCK_EX)
    (state / "pid").write_text(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "started": time.time()}))
    return handle


def run(job: dict[str, Any], events: _Events) -> int:
    out_dir = Path(job["out_dir"])
    state = out_dir / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    events.log = open(state / "events.jsonl", "a")
    from ekka_core.contracts.spec import DiagnosisSpec

    spec = DiagnosisSpec.from_json(job["spec"]).validate()   # bad input fails here, before torch is imported
    lock = _lock(state, events)
    env = {str(k): str(v) for k, v in (job.get("env") or {}).items()}
    os.environ.update(env)           # this process's own stages see them too; capture passes them to its workers

    from ekka_core.pipeline import diagnose

    stage_start: dict[str, float] = {}
    t0 = time.time()

    def progress(stage: str, message: str) -> None:
        stage_start.setdefault(stage, time.time())
        events.emit("progress", stage=stage, message=message)

    result = diagnose(spec, out_dir, fresh=bool(job.get("fresh")), progress=progress, env=env or None)
    report = result.report
    traces = out_dir / "traces"
    trace_bytes = {name: _dir_bytes(traces / name) for name in ("target", "reference", "reference-fp32")}
    stages = sorted(stage_start.items(), key=lambda kv: kv[1])
    seconds = {s: round((stages[i + 1][1] if i + 1 < len(stages) else time.time()) - t, 2)
               for i, (s, t) in enumerate(stages)}
    summary = {
        "schema": "ekka.remote-summary/1",
        "host": os.uname().nodename,
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "ekka_file": _ekka_file(),
        "out_dir": str(out_dir),
        "traces_dir": str(traces),
        "trace_bytes": trace_bytes,
        "trace_bytes_total": sum(trace_bytes.values()),
        "reused_traces": report.meta.reused_traces,
        "verdict": report.verdict,
        "seconds": round(time.time() - t0, 2),
        "stage_seconds": seconds,
        "logs": {p.name: _tail(p) for p in sorted(traces.glob("*.log"))},
    }
    bundle = state / RESULTS
    tmp = state / (RESULTS + ".tmp")
    # LZMA, as the engine bundle (.tar.xz) already needs on both ends: the results are a first diagnosis' bytes too
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as zf:
        for name in RESULT_FILES:
            if (out_dir / name).is_file():
                zf.write(out_dir / name, name)
        zf.writestr("summary.json", json.dumps(summary, indent=1))
    os.replace(tmp, bundle)
    events.emit("done", results=str(bundle), results_bytes=bundle.stat().st_size, verdict=report.verdict,
                trace_bytes=summary["trace_bytes_total"], reused_traces=report.meta.reused_traces,
                out_dir=str(out_dir), detached=events.detached)
    lock.close()
    return 0


def _ekka_file() -> str:
    import ekka_core
    return str(ekka_core.__file__)


def _plugin_from() -> str | None:
    """Where vLLM will load Ekka's plugin from (the distribution declaring ``vllm.general_plugins: ekka``)."""
    try:
        from importlib.metadata import entry_points
        for ep in entry_points(group="vllm.general_plugins"):
            if ep.name == "ekka":
                return str(getattr(ep.dist, "_path", None) or ep.value)
    except Exception:  # noqa: BLE001 - diagnostics only
        pass
    return None


def main() -> int:
    try:
        os.setsid()                  # its own session and process group: cancel kills exactly this run's tree
    except OSError:
        pass                         # already a session leader (sshd made it one): pgid == pid either way
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    events = _Events()
    events.emit("hello", protocol=PROTOCOL, pid=os.getpid(), pgid=os.getpgid(0), python=sys.executable,
                python_version=sys.version.split()[0], ekka_file=_ekka_file(), plugin_from=_plugin_from(),
                host=os.uname().nodename)
    try:
        job = json.loads(sys.stdin.readline() or "{}")
        if job.get("protocol") != PROTOCOL:
            raise InternalFailure(f"remote host process speaks protocol {PROTOCOL}, the client sent "
                                  f"{job.get('protocol')}", fix="deploy the same Ekka version on both sides")
        return run(job, events)
    except Exception as e:  # noqa: BLE001 - every failure becomes one error event
        if isinstance(e, EkkaError):
            events.emit("error", **e.to_json())
            return e.exit_code
        events.emit("error", **internal_error(e).to_json(traceback=traceback.format_exc()[-LOG_TAIL:]))
        return 3


if __name__ == "__main__":
    sys.exit(main())
