"""End-to-end tests of the Ekka language server (``python -m server``) with pytest-lsp over stdio.

The demo case (tiny Gemma 3 with vLLM's sliding-window bug re-injected) is captured once in this test process;
the server's diagnoses of the same spec and output directory reuse those traces (same spec, same EKKA_* env →
same capture fingerprint), so each of them costs a worker start plus the analysis, not three model runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import re
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import psutil
from capture_processes import capture_running
import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.uris import from_fs_path, to_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from ekka_core import bugs
from ekka_core.contracts.report import Report
from server.present import rendered

REPO_ROOT = Path(__file__).resolve().parents[2]
BUG = "gemma3-sliding-window-every-layer"
ENV = {bugs.ENV_VAR: BUG}
HEAVY = ("torch", "vllm", "transformers")

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


# -------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def demo(zoo_model, tmp_path_factory) -> dict[str, Any]:
    """The demo spec as a ``.ekka.toml`` in a fresh workspace, and its traces captured once (as `ekka demo`)."""
    from ekka_core.pipeline import diagnose
    from ekka_core.repro import to_toml
    from ekka_core.contracts.spec import DiagnosisSpec

    from ekka_core.capture.vllm_config import traced_baseline

    bug = bugs.get(BUG)
    model = str(zoo_model(bug.arch, **bug.zoo_overrides))
    # Served as the traced baseline: one engine run (the served configurations have tests of their own).
    spec = DiagnosisSpec(model=model, prompts=bug.prompts or bugs.DEFAULT_PROMPTS, dtype=bug.dtype, max_new_tokens=6,
                         engine_args=traced_baseline(model))
    ws = tmp_path_factory.mktemp("workspace")
    spec_file = ws / "demo.ekka.toml"
    spec_file.write_text(to_toml({k: v for k, v in spec.to_json().items()
                                  if k in ("model", "target", "reference", "dtype", "max_new_tokens", "prompts",
                                           "engine_args")}))
    out = ws / "ekka-out" / "demo"
    report = diagnose(spec, out, env=ENV).report
    assert report.verdict == "divergent"
    return {"workspace": ws, "spec_file": spec_file, "out": out, "report": report, "spec": spec}


class Recorder:
    """Custom notifications the server sends (``ekka/jobState``, ``ekka/reportUpdated``), with arrival times."""

    def __init__(self) -> None:
        self.states: list[tuple[float, dict[str, Any]]] = []
        self.reports: list[tuple[float, dict[str, Any]]] = []
        self.lens_refreshes = 0

    def job(self, job_id: str) -> list[dict[str, Any]]:
        return [s for _, s in self.states if s["jobId"] == job_id]

    async def final(self, job_id: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for s in self.job(job_id):
                if s["state"] in ("done", "failed", "cancelled"):
                    return s
            await asyncio.sleep(0.1)
        raise AssertionError(f"job {job_id} did not finish in {timeout} s: {self.job(job_id)[-3:]}")

    async def running_pid(self, job_id: str, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for s in self.job(job_id):
                if s["state"] == "running" and s.get("pid"):
                    return s["pid"]
            await asyncio.sleep(0.05)
        raise AssertionError(f"job {job_id} never ran: {self.job(job_id)}")


@attrs.define
class RawNotification:
    method: str
    jsonrpc: str
    params: Any = None


SERVER_ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


@pytest_lsp.fixture(scope="module",
                    config=ClientServerConfig(server_command=[sys.executable, "-m", "server"], server_env=SERVER_ENV))
async def client(lsp_client: LanguageClient, demo):
    rec = Recorder()
    lsp_client.ekka = rec  # type: ignore[attr-defined]
    # Keep ekka/* notification params as the plain JSON the extension gets (pygls would build namedtuples,
    # renaming keys such as "class").
    known = lsp_client.protocol.get_message_type
    lsp_client.protocol.get_message_type = (  # type: ignore[method-assign]
        lambda method: RawNotification if method.startswith("ekka/") else known(method))

    @lsp_client.feature("ekka/jobState")
    def _state(params: Any) -> None:
        rec.states.append((time.monotonic(), _plain(params)))

    @lsp_client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def _refresh(params: Any) -> None:
        rec.lens_refreshes += 1

    @lsp_client.feature("ekka/reportUpdated")
    def _report(params: Any) -> None:
        rec.reports.append((time.monotonic(), _plain(params)))

    ws = demo["workspace"]
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        root_uri=from_fs_path(str(ws)),
        workspace_folders=[types.WorkspaceFolder(uri=from_fs_path(str(ws)), name="ws")],
        initialization_options={"settings": {"interpreter": sys.executable}}))
    yield
    await lsp_client.shutdown_session()


def _plain(obj: Any) -> Any:
    """Custom notification params arrive as attrs-like namespaces: back to plain dicts/lists."""
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "__dict__"):
        return {k: _plain(v) for k, v in vars(obj).items()}
    return obj


async def _execute(client: LanguageClient, command: str, *arguments: Any) -> Any:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=command, arguments=list(arguments)))


async def _status(client: LanguageClient) -> dict[str, Any]:
    return _plain(await _execute(client, "ekka.server.status"))


def _uri_for(diagnostics: dict[str, Any], path: str) -> str | None:
    want = os.path.realpath(path)
    for uri in diagnostics:
        p = to_fs_path(uri)
        if p and os.path.realpath(p) == want:
            return uri
    return None


def _session_alive(sid: int) -> list[psutil.Process]:
    alive = []
    for p in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


# ---------------------------------------------------------------------------------------------- tests


async def test_diagnose_spec_file_publishes_results_on_the_engine_source(client: LanguageClient, demo):
    rec: Recorder = client.ekka  # type: ignore[attr-defined]
    t0 = time.monotonic()
    result = _plain(await _execute(client, "ekka.server.diagnose",
                                   {"uri": from_fs_path(str(demo["spec_file"])), "env": ENV}))
    answered = time.monotonic()
    job_id = result["jobId"]
    assert answered - t0 < 5, "the command must answer at once and run the job in the background"

    final = await rec.final(job_id)
    assert final["state"] == "done", final
    done_at = next(t for t, s in rec.states if s["jobId"] == job_id and s["state"] == "done")
    assert done_at > answered
    assert final["verdict"] == "divergent" and final["exit_code"] == 1
    assert final["out_dir"] == str(demo["out"])     # default <workspace>/ekka-out/<spec name>: traces reused

    # Work-done progress: begin (cancellable), per-stage reports with growing percentages, end.
    progress = client.progress_reports[f"ekka-{job_id}"]
    assert isinstance(progress[0], types.WorkDoneProgressBegin) and progress[0].cancellable
    reports = [p for p in progress if isinstance(p, types.WorkDoneProgressReport)]
    assert any(r.message.startswith("capture:") for r in reports)
    assert any(r.message.startswith("analysis:") for r in reports)
    percents = [r.percentage for r in reports]
    assert percents == sorted(percents) and percents[-1] >= 90
    assert isinstance(progress[-1], types.WorkDoneProgressEnd)
    assert {s["stage"] for s in rec.job(job_id)} >= {"capture", "tree", "mapping", "align", "analysis", "report"}

    # The report, for the tree view and the plots.
    _, payload = next((t, p) for t, p in rec.reports if p["jobId"] == job_id)
    report = payload["report"]
    assert report["verdict"] == "divergent" and report["meta"]["reused_traces"] is True
    assert report["plots"]["series"] and Path(payload["paths"]["html"]).exists()
    # ... and the report in Python's words, shown verbatim by the editor: the coverage sections, the headline
    assert {k: payload[k] for k in ("headline", "coverage", "coverageLine")} == rendered(Report.from_json(report))
    assert payload["headline"] == final["message"] and payload["headline"].startswith("divergent: #1 ")

    # Diagnostics on the rank-1 suspect's class line, in the installed vLLM source (0-based LSP lines).
    top = report["suspects"][0]
    assert top["target"]["module"] == "model.layers.3.self_attn.attn"
    uri = _uri_for(client.diagnostics, top["target"]["file"])
    assert uri is not None, list(client.diagnostics)
    assert "site-packages/vllm/" in to_fs_path(uri)
    diags = client.diagnostics[uri]
    d = next(d for d in diags if d.range.start.line == top["target"]["line"] - 1)
    assert d.severity == types.DiagnosticSeverity.Error
    assert d.source == "ekka" and d.code == "ekka-suspect"
    ratio = f"{top['error_ratio']:.1f}"
    assert "#1" in d.message and ratio in d.message and f"token {top['onset_token']}" in d.message, d.message
    assert "o_proj" in d.message                          # the reference module
    src = Path(top["target"]["file"]).read_text().splitlines()
    assert re.match(r"\s*class Attention\b", src[d.range.start.line])
    if top["target"]["forward_file"] == top["target"]["file"]:
        assert any(x.range.start.line == top["target"]["forward_line"] - 1 and x.code == "ekka-suspect-forward"
                   for x in diags)
    if top["target"].get("call_file"):     # the call site in the parent's forward, when the engine found it
        call_uri = _uri_for(client.diagnostics, top["target"]["call_file"])
        assert any(x.range.start.line == top["target"]["call_line"] - 1 and x.code == "ekka-suspect-call"
                   for x in client.diagnostics[call_uri])
    # Rank 2 is a warning on its own class line.
    second = report["suspects"][1]
    uri2 = _uri_for(client.diagnostics, second["target"]["file"])
    assert any(x.range.start.line == second["target"]["line"] - 1
               and x.severity == types.DiagnosticSeverity.Warning for x in client.diagnostics[uri2])

    # Code lens on the class line (the client was asked to refresh its lenses).
    assert rec.lens_refreshes >= 1
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    lens = next(lens for lens in lenses if lens.range.start.line == top["target"]["line"] - 1)
    assert lens.command.command == "ekka.showDivergence"
    assert lens.command.title.startswith("Ekka #1 · ratio ") and "Show divergence" in lens.command.title
    assert f"token {top['onset_token']}" in lens.command.title
    assert _plain(lens.command.arguments) == [{"jobId": job_id, "module": top["target"]["module"]}]

    # Hover on the class line: per-layer table of the class's modules and a sparkline.
    hov = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=top["target"]["line"] - 1, character=8)))
    assert hov is not None and hov.contents.kind == types.MarkupKind.Markdown
    md = hov.contents.value
    assert "| module | error ratio |" in md
    for layer in range(4):
        assert f"`model.layers.{layer}.self_attn.attn`" in md
    assert re.search(r"`[▁▂▃▄▅▆▇█ ]{4}`", md), md
    # A line that is not a class line has no hover.
    assert await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=0, character=0))) is None

    # The server process never imported the heavy engine (torch, vllm, transformers, sglang), a whole diagnosis on.
    status = await _status(client)
    assert status["pid"] == client._server.pid
    assert status["heavy_modules"] == []
    assert status["settings"]["globalSettings"]["interpreter"] == sys.executable   # the typed settings object


async def test_diagnostics_survive_open_and_close(client: LanguageClient, demo):
    top = demo["report"].top
    uri = _uri_for(client.diagnostics, top.target.file)
    before = list(client.diagnostics[uri])
    client.diagnostics[uri] = []          # forget them client-side: didOpen must publish them again
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=Path(top.target.file).read_text())))
    for _ in range(50):
        if client.diagnostics[uri]:
            break
        await asyncio.sleep(0.1)
    assert [d.message for d in client.diagnostics[uri]] == [d.message for d in before]
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))
    await asyncio.sleep(0.3)
    assert client.diagnostics[uri]        # closing the file does not clear them
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert lenses


async def test_diagnose_repro_script(client: LanguageClient, demo):
    """A vLLM repro script is read with libcst (never run) into the same spec: the demo's traces are reused."""
    rec: Recorder = client.ekka  # type: ignore[attr-defined]
    spec = demo["spec"]
    script = demo["workspace"] / "repro_gemma3.py"
    # The script serves what the demo spec serves (the traced baseline), as engine keywords.
    engine_kwargs = ", ".join(f"{k}={v!r}" for k, v in spec.engine_args.items())
    script.write_text(
        "from vllm import LLM, SamplingParams\n\n"
        f"MODEL = {spec.model!r}\nPROMPTS = {spec.prompts!r}\n\n"
        'if __name__ == "__main__":\n'
        f'    llm = LLM(model=MODEL, dtype="bfloat16", {engine_kwargs})\n'
        f"    for out in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens={spec.max_new_tokens})):\n"
        "        print(out.outputs[0].text)\n")
    job_id = _plain(await _execute(client, "ekka.server.diagnose", {
        "uri": from_fs_path(str(script)), "out_dir": str(demo["out"]), "env": ENV}))["jobId"]
    final = await rec.final(job_id)
    assert final["state"] == "done" and final["verdict"] == "divergent", final
    report = next(p for _, p in rec.reports if p["jobId"] == job_id)["report"]
    assert report["meta"]["reused_traces"] is True
    assert report["spec"]["prompts"] == spec.prompts and report["spec"]["target"] == "vllm"


async def test_bad_spec_fails_with_the_fix(client: LanguageClient, demo):
    rec: Recorder = client.ekka  # type: ignore[attr-defined]
    bad = demo["workspace"] / "bad.ekka.toml"
    bad.write_text('model = "/nonexistent/ekka-model"\nprompts = ["hello"]\n')
    n_messages = len(client.messages)
    job_id = _plain(await _execute(client, "ekka.server.diagnose", {"uri": from_fs_path(str(bad))}))["jobId"]
    final = await rec.final(job_id, timeout=60)
    assert final["state"] == "failed" and final["exit_code"] == 2
    assert "does not exist" in final["error"]["message"] and final["error"]["fix"]
    shown = [m for m in client.messages[n_messages:] if m.type == types.MessageType.Error]
    assert shown and "/nonexistent/ekka-model" in shown[0].message and final["error"]["fix"] in shown[0].message
    progress = client.progress_reports[f"ekka-{job_id}"]
    assert isinstance(progress[-1], types.WorkDoneProgressEnd)
    # The previous results are untouched by a failed job.
    assert any(client.diagnostics.values())


async def test_invalid_arguments_are_refused(client: LanguageClient):
    with pytest.raises(JsonRpcException, match="exactly one of"):
        await _execute(client, "ekka.server.diagnose", {"out_dir": "/tmp/x"})
    with pytest.raises(JsonRpcException, match="EKKA_"):
        await _execute(client, "ekka.server.diagnose", {"spec": {"model": "m"}, "env": {"LD_PRELOAD": "x"}})
    with pytest.raises(JsonRpcException, match="neither"):
        await _execute(client, "ekka.server.diagnose", "file:///tmp/notes.txt")


async def test_one_job_at_a_time_and_cancel_command(client: LanguageClient, demo, tmp_path):
    rec: Recorder = client.ekka  # type: ignore[attr-defined]
    args = {"uri": from_fs_path(str(demo["spec_file"])), "out_dir": str(tmp_path / "out"), "fresh": True,
            "env": ENV}
    job_id = _plain(await _execute(client, "ekka.server.diagnose", args))["jobId"]
    with pytest.raises(JsonRpcException, match="already running") as refused:
        await _execute(client, "ekka.server.diagnose", args)
    assert job_id in refused.value.message
    record = _plain(await _execute(client, "ekka.server.cancel", {"jobId": job_id}))
    assert record["jobId"] == job_id and record["state"] == "cancelled"
    assert (await rec.final(job_id))["state"] == "cancelled"


async def test_cancel_during_capture_kills_the_worker_group(client: LanguageClient, demo, tmp_path):
    rec: Recorder = client.ekka  # type: ignore[attr-defined]
    job_id = _plain(await _execute(client, "ekka.server.diagnose", {
        "uri": from_fs_path(str(demo["spec_file"])), "out_dir": str(tmp_path / "out"), "fresh": True,
        "env": ENV}))["jobId"]
    pid = await rec.running_pid(job_id)
    # Wait until the engine's capture subprocess (a grandchild of the server) runs in the worker's session.
    deadline = time.monotonic() + 90
    while not capture_running([" ".join(p.info["cmdline"] or []) for p in _session_alive(pid)]):
        assert time.monotonic() < deadline, "the capture subprocess never started"
        assert rec.job(job_id)[-1]["state"] == "running", rec.job(job_id)[-1]
        await asyncio.sleep(0.2)

    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=f"ekka-{job_id}"))
    final = await rec.final(job_id, timeout=30)
    assert final["state"] == "cancelled"
    for _ in range(50):                   # SIGKILL is immediate; give /proc a moment to catch up
        if not _session_alive(pid):
            break
        await asyncio.sleep(0.1)
    assert _session_alive(pid) == [], [p.info for p in _session_alive(pid)]

    # The server is healthy: the next diagnosis (inline spec fields this time) succeeds.
    job2 = _plain(await _execute(client, "ekka.server.diagnose", {
        "spec": demo["spec"].to_json(), "out_dir": str(demo["out"]), "env": ENV}))["jobId"]
    final2 = await rec.final(job2)
    assert final2["state"] == "done" and final2["verdict"] == "divergent", final2
    status = await _status(client)
    assert [m for m in status["heavy_modules"] if m.split(".")[0] in HEAVY] == []


async def test_worker_that_dies_is_an_internal_failure(client: LanguageClient, demo):
    """ekka.interpreter (here changed through workspace/didChangeConfiguration) runs the worker; a worker that
    exits without answering fails the job with exit code 3 and the server carries on."""
    rec: Recorder = client.ekka  # type: ignore[attr-defined]
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"ekka": {"interpreter": "/bin/false"}}))
    try:
        job_id = _plain(await _execute(client, "ekka.server.diagnose", {
            "uri": from_fs_path(str(demo["spec_file"])), "env": ENV}))["jobId"]
        final = await rec.final(job_id, timeout=30)
        assert final["state"] == "failed" and final["exit_code"] == 3, final
        assert "worker stopped unexpectedly" in final["error"]["message"]
        assert any("worker stopped unexpectedly" in m.message for m in client.messages)
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"ekka": {"interpreter": sys.executable}}))
    assert (await _status(client))["settings"]["globalSettings"]["interpreter"] == sys.executable


async def test_worker_killed_mid_run_is_reported_and_the_server_carries_on(client: LanguageClient, demo, tmp_path):
    """The worker dies during a capture (OOM killer, a crash): one clear error message, the job failed with exit code
    3, and the next diagnosis in the same server succeeds."""
    rec: Recorder = client.ekka  # type: ignore[attr-defined]
    job_id = _plain(await _execute(client, "ekka.server.diagnose", {
        "uri": from_fs_path(str(demo["spec_file"])), "out_dir": str(tmp_path / "out"), "fresh": True,
        "env": ENV}))["jobId"]
    pid = await rec.running_pid(job_id)
    os.kill(pid, signal.SIGKILL)                      # the worker only, as the OOM killer would
    final = await rec.final(job_id, timeout=60)
    assert final["state"] == "failed" and final["exit_code"] == 3, final
    assert any("worker" in m.message and m.type == types.MessageType.Error for m in client.messages)
    job2 = _plain(await _execute(client, "ekka.server.diagnose", {
        "spec": demo["spec"].to_json(), "out_dir": str(demo["out"]), "env": ENV}))["jobId"]
    final2 = await rec.final(job2)
    assert final2["state"] == "done" and final2["verdict"] == "divergent", final2


async def test_clear_removes_diagnostics_lenses_and_hovers(client: LanguageClient, demo):
    top = demo["report"].top
    uri = _uri_for(client.diagnostics, top.target.file)
    assert client.diagnostics[uri]
    cleared = _plain(await _execute(client, "ekka.server.clear"))
    assert cleared["cleared"] >= 1
    for _ in range(50):
        if not client.diagnostics[uri]:
            break
        await asyncio.sleep(0.1)
    assert all(list(d) == [] for d in client.diagnostics.values())
    ident = types.TextDocumentIdentifier(uri=uri)
    assert not await client.text_document_code_lens_async(types.CodeLensParams(text_document=ident))
    assert await client.text_document_hover_async(types.HoverParams(
        text_document=ident, position=types.Position(line=top.target.line - 1, character=0))) is None


async def test_presentation_helpers():
    """Pure parts: suspects on one line merge into one diagnostic (best rank's severity); sparklines are on a
    log scale and leave missing values blank."""
    from ekka_core.contracts.report import Report
    from server.present import Result, diagnostics, fmt_ratio, sparkline

    def suspect(rank: int, module: str, ratio: float | None) -> dict[str, Any]:
        return {"rank": rank, "target": {"module": module, "class": "Attention", "file": "/x/attention.py",
                                         "line": 10, "forward_file": "/x/custom_op.py", "forward_line": 3},
                "reference": {"modules": []}, "error_ratio": ratio, "onset_token": None}

    result = Result("j", Report.from_json({"verdict": "divergent", "threshold": 2.0, "suspects": [suspect(3, "a", 5.0),
                                                                         suspect(1, "b", 1234.5)]}))
    diags = diagnostics(result, lambda path, line: "    class Attention:")
    [(key, [d])] = list(diags.items())      # the inherited forward (another file) gets no diagnostic
    assert d.severity == types.DiagnosticSeverity.Error and d.range.start.line == 9
    assert d.range.start.character == 4 and "#1: b" in d.message and "also #3 a (ratio 5×)" in d.message
    assert fmt_ratio(1234.5) == "1,234" and fmt_ratio(None) == "n/a" and fmt_ratio(0.9123) == "0.912"
    assert sparkline([1.0, None, 1000.0]) == "▁ █"
