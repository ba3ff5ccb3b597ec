"""Names and payload shapes shared by the language server, its worker process and the VS Code extension.

Nothing here imports the engine's heavy parts (torch, vLLM, transformers): the language server process must
stay light. The extension mirrors these names in ``extension/src/protocol.ts``.

LSP side (namespace ``ekka``)
-----------------------------
Commands (``workspace/executeCommand``):

``ekka.server.diagnose``  one argument, either a URI string or an object
    ``{uri?: str, spec?: {DiagnosisSpec fields}, out_dir?: str, fresh?: bool, env?: {EKKA_*: str}}``
    (exactly one of ``uri`` / ``spec``; ``uri`` names a ``*.ekka.toml`` spec or a ``.py`` repro script).
    Returns ``{jobId}`` at once; the diagnosis runs in the background. Refused with a JSON-RPC error
    (code -32803 RequestFailed, ``data: {jobId}``) while another diagnosis of the same workspace runs.
    ``env`` is for tests and benchmarks only: ``EKKA_*`` variables handed to the engine (e.g.
    ``EKKA_INJECT_BUG``, which re-injects a known bug); other keys are refused.
``ekka.server.cancel``    ``{jobId}`` (or a job id string, or nothing: the running job). Returns the job record.
``ekka.server.clear``     no argument. Clears the published diagnostics, code lenses and hovers. ``{cleared: n}``.
``ekka.server.status``    no argument. ``{pid, python, version, jobs: [job record], heavy_modules, settings}``.

Settings (:mod:`server.settings`): one typed object per workspace folder, ``initializationOptions``
``{settings: [WorkspaceSettings…], globalSettings}`` and ``workspace/didChangeConfiguration``
``{ekka: {settings: […], globalSettings}}``; a job uses the settings of the folder its file is in. Each holds
``workspace`` (the folder's path), ``interpreter`` (``ekka.interpreter``: runs the engine process; precedence in
:mod:`server.settings`), ``pythonInterpreter`` (the Python extension's, when installed), ``targetDefault``
(``ekka.target.default``: the target of a spec that names none), ``executor`` (``local`` | ``ssh://host``),
``remote: {python, workdir}`` and ``engineArgs`` (``ekka.engineArgs``, an object, default ``{}``: engine arguments
merged into the spec's ``engine_args`` for diagnoses started from the editor; the spec's own keys win, values are
typed JSON: ``{"max_num_batched_tokens": 64, "enable_prefix_caching": true}``). Ill-typed settings fail the job
with exit code 2 naming them.

Work-done progress: token ``ekka-<jobId>``; begin (title, cancellable, percentage 0), reports
``"<stage>: <message>"`` with growing percentages (capture 0–70, tree 70, mapping 75, align 80, analysis 85,
report 95), end ``"<state>: <message>"``. ``window/workDoneProgress/cancel`` on the token cancels the job.

Diagnostics (``source: "ekka"``, ``data: {jobId, rank, module}``, severity 1 Error for rank 1, 2 Warning for
rank 2, 3 Information otherwise; suspects on one line merge into one diagnostic):
``ekka-suspect`` on the class definition line, ``ekka-suspect-forward`` on the class's own ``forward`` (not an
inherited one in another file), ``ekka-suspect-call`` where the parent's forward calls the module,
``ekka-suspect-graph-node`` on the source line of each graph node a ``compiled`` suspect names (the line the
compiled graph's departing node was traced from).
Code lenses on suspects' class lines: title ``Ekka #1 · ratio 49.7× · diverges from token 16 · Show
divergence``, command ``ekka.showDivergence`` with ``[{jobId, module}]``. A report with a release bisection
(``bisect``, outcome ``regression-found``) adds ``changed in 1.1 (last good 1.0) · Show diff`` on the class line
of the suspect the bisection names (rank 1) with ``[{jobId}]``, and on each changed symbol's line in the first bad
release's file (``file_bad:line_bad``) with ``[{jobId, symbol}]``; command ``ekka.showReleaseDiff`` (the client
shows the diffs from the report it got with ``ekka/reportUpdated``). Hovers on the class (or own forward) line of
any compared module's class: Markdown table of that class's modules and their error ratios, sparkline, and (with a
``serving`` section) under which configuration it diverges and was traced. With configuration triage the
diagnostics' message ends ``(served: diverges only with batching on)``.

Notifications (server → client):

``ekka/jobState``       a job record (below), sent on every state, stage or progress change.
``ekka/reportUpdated``  ``{jobId, report, paths: {json, md, html}, out_dir, uri, headline, coverage, coverageLine}``
                        after each finished diagnosis; ``report`` is report.json as :meth:`Report.to_json
                        <ekka_core.contracts.report.Report.to_json>` writes it (every field present; JSON Schema:
                        ``ekka_core/contracts/report.schema.json``, TypeScript: ``extension/src/report.generated.ts``).
                        The rest is the report in Python's words, which the editor shows verbatim
                        (:func:`server.present.rendered`): ``headline`` the verdict in a few words (the job's
                        message), ``coverage`` the sections of what was and was not observed ``[{key, title, items:
                        [{label, text}]}]`` (:func:`ekka_core.report.coverage.coverage`; ``key`` one of ``missing |
                        checks | conventions | unchecked | notes``), ``coverageLine`` how much was compared.

Job record: ``{jobId, state, stage, percent, message, uri, out_dir, pid, exit_code, error, verdict}`` with
``state`` one of ``queued | running | done | failed | cancelled``, ``stage`` one of the pipeline's STAGES (or
null), ``error`` null or the error envelope ``{message, fix, exit_code}`` (:meth:`EkkaError.to_json
<ekka_core.contracts.errors.EkkaError.to_json>`; exit_code 2 bad input, 3 internal failure).

Engine process (``python -m server.engine_process``: newline-delimited JSON-RPC 2.0 over stdin/stdout)
------------------------------------------------------------------------------------------------------
request ``diagnose {spec: {DiagnosisSpec fields}, out_dir, fresh, env?}``
  → notifications ``progress {id, stage, message, percent}``
  → response ``result {report, paths: {json, md, html}, modules: {module: {class, file, line, forward_file,
    forward_line}}}`` (``report``: ``Report.to_json()``, read once by the server into ``server.jobs.WorkerResult``)
    or ``error {code: -32000 - exit_code, message, data: <error envelope, with traceback for an internal
    failure>}`` (:func:`worker_error` / :func:`worker_failure`).
request ``ping`` → ``{pid, python, heavy_modules}``.  EOF on stdin ends the worker.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ekka_core import STAGE_WEIGHTS, STAGES
from ekka_core.contracts.errors import EkkaError

# ----------------------------------------------------------------------------------------------- LSP names

CMD_DIAGNOSE = "ekka.server.diagnose"
CMD_CANCEL = "ekka.server.cancel"
CMD_CLEAR = "ekka.server.clear"
CMD_STATUS = "ekka.server.status"
# Client-side command the code lenses invoke (registered by the extension, not by the server).
CLIENT_SHOW_DIVERGENCE = "ekka.showDivergence"
# Client-side command of the release-bisection code lenses: ``[{jobId, symbol?}]``.
CLIENT_SHOW_RELEASE_DIFF = "ekka.showReleaseDiff"

NOTIFY_REPORT_UPDATED = "ekka/reportUpdated"
NOTIFY_JOB_STATE = "ekka/jobState"

DIAGNOSTIC_SOURCE = "ekka"
CODE_SUSPECT = "ekka-suspect"
CODE_SUSPECT_FORWARD = "ekka-suspect-forward"
CODE_SUSPECT_CALL = "ekka-suspect-call"
CODE_SUSPECT_GRAPH_NODE = "ekka-suspect-graph-node"

STATES = ("queued", "running", "done", "failed", "cancelled")
FINAL_STATES = ("done", "failed", "cancelled")

# LSP error code RequestFailed (3.17): a well-formed request the server could not carry out.
REQUEST_FAILED = -32803

HEAVY_PACKAGES = ("torch", "vllm", "transformers", "sglang")

# Where each of the pipeline's stages starts on the 0–100 progress scale: the weights of the stages before it.
STAGE_START = {stage: sum(STAGE_WEIGHTS[s] for s in STAGES[:i]) for i, stage in enumerate(STAGES)}


def stage_percent(stage: str, nth_message: int) -> int:
    """Progress for the ``nth_message`` (0-based) message of ``stage``: each further message of a stage moves
    half-way to the next stage's start, so the percentage only grows."""
    start = STAGE_START.get(stage, 0)
    later = [v for v in STAGE_START.values() if v > start]
    end = min(later) if later else 100
    return int(start + (end - start) * (1 - 0.5 ** nth_message))


def heavy_modules() -> list[str]:
    """The heavy packages loaded in this process (the language server must show none)."""
    return sorted(m for m in list(sys.modules) if m.split(".", 1)[0] in HEAVY_PACKAGES)


# ------------------------------------------------------------------------------------ worker wire format


def encode(message: dict[str, Any]) -> bytes:
    """One JSON-RPC message as one line (JSON never contains a raw newline)."""
    return (json.dumps({"jsonrpc": "2.0", **message}, allow_nan=False, default=str) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any]:
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ValueError(f"not a JSON-RPC message: {line[:200]!r}")
    return msg


def worker_error(err: EkkaError, *, traceback: str | None = None) -> dict[str, Any]:
    """The ``error`` member of a failed engine-process response: the error envelope as its ``data``."""
    return {"code": -32000 - err.exit_code, "message": err.message, "data": err.to_json(traceback=traceback)}


def worker_failure(error: Any) -> EkkaError:
    """The error a failed engine-process response carries, raised again in the server unchanged."""
    error = error if isinstance(error, dict) else {}
    data = error.get("data") if isinstance(error.get("data"), dict) else None
    return EkkaError.from_json(data or {"message": error.get("message") or "engine process error", "exit_code": 3})
