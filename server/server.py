"""The Ekka language server (pygls 2): diagnoses from the editor, results on the engine's source lines.

The server stays light — pygls, lsprotocol and the engine's spec/repro readers; never torch, vLLM or
transformers. A diagnosis runs as an asyncio task that drives an engine process (:mod:`server.engine_process`); see
:mod:`server.protocol` for command names and payloads.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from ekka_core import __version__
from ekka_core.contracts.env import check_ekka_env
from ekka_core.contracts.errors import EkkaError, InternalFailure
from ekka_core.contracts.report import EXIT_CODES, short_headline
from server.jobs import REMOTE_CANCEL_GRACE_S, Job, WorkerProcess, WorkerResult, kill_if_alive, kill_session
from server.present import Result, code_lenses, diagnostics, hover, path_key, rendered
from server.protocol import (CMD_CANCEL, CMD_CLEAR, CMD_DIAGNOSE, CMD_STATUS, FINAL_STATES, NOTIFY_JOB_STATE,
                             NOTIFY_REPORT_UPDATED, REQUEST_FAILED, heavy_modules)
from server.settings import Settings, resolve_interpreter

log = logging.getLogger("ekka.server")

_DIAGNOSE_KEYS = {"uri", "spec", "out_dir", "fresh", "env"}
MAX_KEPT_JOBS = 50          # finished job records kept for ekka.server.cancel / ekka.server.status


class EkkaServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("ekka", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.settings = Settings()                  # per workspace folder (server.settings)
        self.jobs: dict[str, Job] = {}
        self.active: dict[str, str] = {}              # workspace key → running job id
        self.results: dict[str, Result] = {}          # workspace key → latest finished diagnosis
        self.token_jobs: dict[str, str] = {}          # progress token → job id
        self.diags: dict[str, list[types.Diagnostic]] = {}   # path_key → diagnostics currently published
        self.uris: dict[str, set[str]] = {}           # path_key → URIs published under (report's + client's)
        self._lines: dict[str, list[str] | None] = {}
        atexit.register(self.kill_workers)

    def kill_workers(self) -> None:
        """Last resort (server exiting): no worker outlives the server."""
        for job in self.jobs.values():
            if job.proc is not None and job.proc.returncode is None:
                kill_session(job.proc.pid)

    # ------------------------------------------------------------------------------------------ settings

    def update_settings(self, options: Any) -> None:
        """initializationOptions or didChangeConfiguration: one typed settings object per workspace folder."""
        self.settings.update(options)

    def root(self) -> str | None:
        folders = list(self.workspace.folders.values()) if self.workspace else []
        if folders:
            return to_fs_path(folders[0].uri)
        return self.workspace.root_path if self.workspace else None

    def workspace_of(self, path: str | None) -> str:
        """The workspace folder containing ``path`` (the first one otherwise): one job at a time per folder."""
        folders = [to_fs_path(f.uri) for f in self.workspace.folders.values()] if self.workspace else []
        if path:
            for folder in sorted((f for f in folders if f), key=len, reverse=True):
                if os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == os.path.abspath(folder):
                    return folder
        return self.root() or (str(Path(path).parent) if path else os.getcwd())

    # -------------------------------------------------------------------------------------- publishing

    def line_text(self, path: str, line: int) -> str | None:
        key = path_key(path)
        if key not in self._lines:
            try:
                self._lines[key] = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                self._lines[key] = None
        lines = self._lines[key]
        return lines[line] if lines is not None and 0 <= line < len(lines) else None

    def publish_all(self) -> None:
        """Publish the diagnostics of every kept result; files that no longer have any get an empty list."""
        self._lines.clear()
        new: dict[str, list[types.Diagnostic]] = {}
        spelled: dict[str, str] = {}
        for result in self.results.values():
            for key, diags in diagnostics(result, self.line_text).items():
                new.setdefault(key, []).extend(diags)
            spelled.update(result.files())
        for key in set(self.diags) - set(new):
            for uri in self.uris.pop(key, set()):
                self._publish(uri, [])
        self.diags = new
        for key, diags in new.items():
            uris = self.uris.setdefault(key, set())
            uris.add(from_fs_path(spelled[key]) or spelled[key])
            for uri in uris:
                self._publish(uri, diags)

    def _publish(self, uri: str, diags: list[types.Diagnostic]) -> None:
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diags))

    def republish(self, uri: str) -> None:
        path = to_fs_path(uri)
        if not path:
            return
        key = path_key(path)
        if key in self.diags:
            self.uris.setdefault(key, set()).add(uri)
            self._publish(uri, self.diags[key])

    def refresh_lenses(self) -> None:
        caps = self.client_capabilities.workspace
        if caps and caps.code_lens and caps.code_lens.refresh_support:
            async def refresh() -> None:
                try:
                    await self.workspace_code_lens_refresh_async(None)
                except Exception as e:  # noqa: BLE001 - a client that refuses the refresh just keeps old lenses
                    log.debug("codeLens refresh refused: %s", e)
            asyncio.ensure_future(refresh())

    def clear(self) -> int:
        n = len(self.diags)
        self.results.clear()
        self.publish_all()
        self.refresh_lenses()
        return n

    # --------------------------------------------------------------------------------------------- jobs

    def notify_state(self, job: Job) -> None:
        self.protocol.notify(NOTIFY_JOB_STATE, job.record())

    def log_message(self, text: str, kind: types.MessageType = types.MessageType.Log) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=text))

    def start_job(self, req: dict[str, Any]) -> Job:
        uri = req.get("uri")
        path = to_fs_path(uri) if uri else None
        ws = self.workspace_of(path)
        if ws in self.active:
            running = self.active[ws]
            raise JsonRpcException(
                message=f"a diagnosis is already running in this workspace (job {running}); wait for it to "
                        f"finish or cancel it (command {CMD_CANCEL})",
                code=REQUEST_FAILED, data={"jobId": running})
        job = Job(id=Job.new_id(), workspace=ws, uri=uri)
        finished = [j for j in self.jobs.values() if j.state in FINAL_STATES]
        for old in finished[:max(0, len(finished) - MAX_KEPT_JOBS)]:
            del self.jobs[old.id]
        self.jobs[job.id] = job
        self.active[ws] = job.id
        job.task = asyncio.create_task(self.run_job(job, req, path))
        return job

    async def run_job(self, job: Job, req: dict[str, Any], path: str | None) -> None:
        worker: WorkerProcess | None = None
        try:
            self.notify_state(job)
            await self._begin_progress(job, path)
            settings = self.settings.for_path(path or job.workspace)
            settings.check()
            spec, notes = await asyncio.to_thread(resolve_spec, req, path, job.workspace)
            spec = settings.apply_to_spec(spec, target_given=spec_names_target(req, path))
            if settings.engine_args:
                self.log_message(f"Ekka: engine arguments from ekka.engineArgs (the spec's own win): "
                                 f"{settings.engine_args}")
            for note in notes:
                self.log_message(f"Ekka: {note}", types.MessageType.Warning)
            job.out_dir = resolve_out_dir(req, path, job.workspace)
            if job.cancel_requested:
                raise asyncio.CancelledError
            interpreter = resolve_interpreter(settings, settings.workspace or job.workspace)
            worker = WorkerProcess(interpreter, job.workspace if os.path.isdir(job.workspace) else None,
                                   on_log=lambda line: print(f"[ekka worker {job.id}] {line}", file=sys.stderr,
                                                             flush=True))
            proc = await worker.start()
            job.proc, job.pid = proc, proc.pid
            if job.cancel_requested:       # cancelled while the worker was starting
                worker.kill()
                raise asyncio.CancelledError
            self._progress(job, state="running", message=f"worker started ({interpreter})")
            executor = settings.executor_params()
            job.remote = executor is not None
            params = {"spec": spec, "out_dir": job.out_dir, "fresh": bool(req.get("fresh")), "env": req.get("env"),
                      "executor": executor}
            result = await worker.diagnose(params, lambda p: self._progress(
                job, stage=p.get("stage"), message=p.get("message", ""), percent=p.get("percent")))
            await worker.close()
            self._finish_ok(job, result)
        except asyncio.CancelledError:
            job.state, job.message = "cancelled", "cancelled"
        except EkkaError as e:
            if job.cancel_requested:       # the engine process was killed because the user cancelled
                job.state, job.message = "cancelled", "cancelled"
            else:
                self._fail(job, e)
        except Exception as e:  # noqa: BLE001 - a failing job never takes the server down
            log.exception("job %s failed", job.id)
            self._fail(job, InternalFailure(f"internal error in the Ekka server: {type(e).__name__}: {e}",
                                            fix="see the Ekka output"))
        finally:
            if worker is not None and worker.proc is not None and worker.proc.returncode is None:
                worker.kill()
                try:
                    await asyncio.wait_for(worker.wait(), 10)
                except asyncio.TimeoutError:
                    log.warning("worker %s of job %s did not exit after SIGKILL", job.pid, job.id)
            if self.active.get(job.workspace) == job.id:
                del self.active[job.workspace]
            self._end_progress(job)
            self.notify_state(job)
            job.done.set()

    def _finish_ok(self, job: Job, result: WorkerResult) -> None:
        report = result.report
        job.state, job.verdict, job.stage, job.percent = "done", report.verdict, None, 100
        job.exit_code = EXIT_CODES[report.verdict]
        job.message = short_headline(report)
        self.results[job.workspace] = Result(job.id, report, modules=result.modules, paths=result.paths,
                                             out_dir=job.out_dir, uri=job.uri)
        self.publish_all()
        self.refresh_lenses()
        self.protocol.notify(NOTIFY_REPORT_UPDATED, {"jobId": job.id, "report": report.to_json(),
                                                     "paths": result.paths, "out_dir": job.out_dir, "uri": job.uri,
                                                     **rendered(report)})

    def _fail(self, job: Job, err: EkkaError) -> None:
        job.state, job.exit_code = "failed", err.exit_code
        job.error = err.to_json()              # the envelope, without the traceback (that goes to the log)
        job.message = err.message
        text = f"Ekka: {err}"
        self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=text))
        self.log_message(text + (f"\n{err.traceback}" if err.traceback else ""), types.MessageType.Error)

    def cancel(self, job: Job) -> None:
        if job.state in FINAL_STATES:
            return
        job.cancel_requested = True
        job.message = "cancelling"
        if job.proc is not None and job.proc.returncode is None:
            if job.remote:
                # A remote job's worker stops the run on the host first (SIGUSR1 → kill the remote process
                # group over SSH); it is killed here only if it has not exited after a grace period.
                os.kill(job.proc.pid, signal.SIGUSR1)
                asyncio.get_running_loop().call_later(REMOTE_CANCEL_GRACE_S, kill_if_alive, job.proc)
            else:
                kill_session(job.proc.pid)     # the reader sees EOF and the task ends the job as cancelled
        # Before the worker runs, the task checks cancel_requested at each step (never Task.cancel(): a
        # cancellation landing inside create_subprocess_exec could leak the process it was starting).

    # ---------------------------------------------------------------------------------------- progress

    async def _begin_progress(self, job: Job, path: str | None) -> None:
        caps = self.client_capabilities.window
        if not (caps and caps.work_done_progress):
            return
        token = f"ekka-{job.id}"
        try:
            await asyncio.wait_for(self.work_done_progress.create_async(token), 10)
        except Exception as e:  # noqa: BLE001 - no progress UI is not a reason to fail the job
            log.warning("work-done progress refused: %s", e)
            return
        job.token = token
        self.token_jobs[token] = job.id
        title = f"Ekka: diagnosing {Path(path).name}" if path else "Ekka: diagnosing"
        self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
            title=title, cancellable=True, message="reading the spec", percentage=0))

    def _progress(self, job: Job, *, state: str | None = None, stage: str | None = None, message: str = "",
                  percent: int | None = None) -> None:
        if state:
            job.state = state
        if stage:
            job.stage = stage
        if percent is not None:
            job.percent = max(job.percent, int(percent))
        job.message = message
        if job.token:
            text = f"{job.stage}: {message}" if job.stage else message
            self.work_done_progress.report(job.token, types.WorkDoneProgressReport(
                message=text, percentage=job.percent, cancellable=True))
        self.notify_state(job)

    def _end_progress(self, job: Job) -> None:
        if job.token:
            self.work_done_progress.end(job.token, types.WorkDoneProgressEnd(message=f"{job.state}: {job.message}"))
            self.token_jobs.pop(job.token, None)
            self.work_done_progress.tokens.pop(job.token, None)


# ------------------------------------------------------------------------------------------- arguments


def parse_diagnose_args(args: tuple[Any, ...]) -> dict[str, Any]:
    """``ekka.server.diagnose`` takes one argument: a URI string, or ``{uri | spec, out_dir?, fresh?, env?}``."""
    if len(args) != 1:
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE} takes one argument ({{uri}} or {{spec}}), got {len(args)}")
    arg = args[0]
    if isinstance(arg, str):
        arg = {"uri": arg}
    if not isinstance(arg, dict):
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: the argument must be a URI or an object, got {type(arg).__name__}")
    unknown = set(arg) - _DIAGNOSE_KEYS
    if unknown:
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: unknown keys {sorted(unknown)}; use {sorted(_DIAGNOSE_KEYS)}")
    if ("uri" in arg) == ("spec" in arg):
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: give exactly one of `uri` (a *.ekka.toml spec or a .py repro "
                                   "script) and `spec` (spec fields)")
    if "uri" in arg:
        uri = arg["uri"]
        path = to_fs_path(uri) if isinstance(uri, str) else None
        if not path:
            raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: `uri` must be a file: URI, got {uri!r}")
        if not (path.endswith(".toml") or path.endswith(".py")):
            raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: {path} is neither a *.ekka.toml spec nor a .py repro script")
    elif not isinstance(arg["spec"], dict):
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: `spec` must be an object of DiagnosisSpec fields")
    if "out_dir" in arg and not (isinstance(arg["out_dir"], str) and arg["out_dir"]):
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: `out_dir` must be a path")
    if "fresh" in arg and not isinstance(arg["fresh"], bool):
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: `fresh` must be true or false")
    problem = check_ekka_env(arg.get("env"))
    if problem:
        raise JsonRpcInvalidParams(f"{CMD_DIAGNOSE}: `env` (tests and benchmarks only) {problem}")
    return arg


def resolve_spec(req: dict[str, Any], path: str | None, workspace: str) -> tuple[dict[str, Any], list[str]]:
    """The DiagnosisSpec fields of the request (spec file, repro script read with libcst, or inline fields) and
    notes for the log. BadInput when the input cannot give a spec; the worker validates the spec itself."""
    from ekka_core.contracts.spec import DiagnosisSpec

    if path is None:
        fields = dict(req["spec"])
        model = fields.get("model")
        if isinstance(model, str) and model and not os.path.isabs(model) \
                and os.path.exists(os.path.join(workspace, model)):
            fields["model"] = os.path.abspath(os.path.join(workspace, model))
        return fields, []
    if path.endswith(".py"):
        from ekka_core.repro import import_repro
        imported = import_repro(path)
        spec = imported.spec()        # BadInput when the script does not determine model and prompts
        notes = [f"{Path(path).name}: {n}" for n in imported.notes]
        notes += [f"{Path(path).name}: not imported, the default is used — {u}" for u in imported.unknown]
        return spec.to_json(), notes
    return DiagnosisSpec.from_toml(path).to_json(), []


def spec_names_target(req: dict[str, Any], path: str | None) -> bool:
    """Whether the request's spec names its target (else ``ekka.target.default`` applies). A repro script always
    does: the engine it builds is the target."""
    if path is None:
        return "target" in req["spec"]
    if path.endswith(".py"):
        return True
    import tomllib
    try:
        return "target" in tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return True        # resolve_spec has read it already; a file that changed since keeps its own default


def resolve_out_dir(req: dict[str, Any], path: str | None, workspace: str) -> str:
    """``out_dir`` (relative to the workspace), else ``<workspace>/ekka-out/<spec name>``: a stable directory per
    spec, so an unchanged spec reuses its traces."""
    if req.get("out_dir"):
        out = Path(req["out_dir"]).expanduser()
        return str(out if out.is_absolute() else Path(workspace) / out)
    if path is None:
        name = "inline"
    else:
        name = Path(path).name.removesuffix(".toml").removesuffix(".ekka").removesuffix(".py")
    return str(Path(workspace) / "ekka-out" / name)


# ------------------------------------------------------------------------------------------- handlers

server = EkkaServer()


@server.feature(types.INITIALIZE)
def on_initialize(ls: EkkaServer, params: types.InitializeParams) -> None:
    ls.update_settings(params.initialization_options)


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def on_configuration(ls: EkkaServer, params: types.DidChangeConfigurationParams) -> None:
    ls.update_settings(params.settings)


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def on_open(ls: EkkaServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.republish(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_CODE_LENS)
def on_code_lens(ls: EkkaServer, params: types.CodeLensParams) -> list[types.CodeLens]:
    path = to_fs_path(params.text_document.uri)
    if not path:
        return []
    key = path_key(path)
    return [lens for r in ls.results.values() for lens in code_lenses(r, key, ls.line_text)]


@server.feature(types.TEXT_DOCUMENT_HOVER)
def on_hover(ls: EkkaServer, params: types.HoverParams) -> types.Hover | None:
    path = to_fs_path(params.text_document.uri)
    if not path:
        return None
    key = path_key(path)
    for r in ls.results.values():
        h = hover(r, key, params.position.line)
        if h is not None:
            line = params.position.line
            h.range = types.Range(start=types.Position(line=line, character=0),
                                  end=types.Position(line=line, character=len(ls.line_text(path, line) or "")))
            return h
    return None


@server.feature(types.WINDOW_WORK_DONE_PROGRESS_CANCEL)
def on_progress_cancel(ls: EkkaServer, params: types.WorkDoneProgressCancelParams) -> None:
    job_id = ls.token_jobs.get(str(params.token))
    if job_id and job_id in ls.jobs:
        ls.cancel(ls.jobs[job_id])


@server.feature(types.SHUTDOWN)
def on_shutdown(ls: EkkaServer, params: None) -> None:
    for job in ls.jobs.values():
        ls.cancel(job)


@server.command(CMD_DIAGNOSE)
async def cmd_diagnose(ls: EkkaServer, *args: Any) -> dict[str, str]:
    req = parse_diagnose_args(args)
    job = ls.start_job(req)
    return {"jobId": job.id}


@server.command(CMD_CANCEL)
async def cmd_cancel(ls: EkkaServer, *args: Any) -> dict[str, Any] | None:
    arg = args[0] if args else None
    job_id = arg.get("jobId") if isinstance(arg, dict) else arg
    if job_id is None:
        running = list(ls.active.values())
        if not running:
            return None
        job_id = running[0]
    job = ls.jobs.get(str(job_id))
    if job is None:
        raise JsonRpcException(message=f"no job {job_id!r}", code=REQUEST_FAILED, data={"jobId": job_id})
    ls.cancel(job)
    try:
        await asyncio.wait_for(asyncio.shield(job.done.wait()), 15)
    except asyncio.TimeoutError:
        pass
    return job.record()


@server.command(CMD_CLEAR)
def cmd_clear(ls: EkkaServer, *args: Any) -> dict[str, int]:
    return {"cleared": ls.clear()}


@server.command(CMD_STATUS)
def cmd_status(ls: EkkaServer, *args: Any) -> dict[str, Any]:
    return {"pid": os.getpid(), "python": sys.executable, "version": __version__,
            "jobs": [j.record() for j in ls.jobs.values()], "heavy_modules": heavy_modules(),
            "settings": ls.settings.to_json()}
