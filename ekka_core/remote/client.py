"""The local half of a remote diagnosis: SSH (asyncssh), deploy, run the host process, stream progress, fetch results.

Public entry points are in :mod:`ekka_core.remote` (this module imports asyncssh).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import secrets
import shlex
import socket
import struct
import sys
import time
import zipfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

try:
    import asyncssh
except ImportError as e:  # pragma: no cover - the [remote] extra is missing
    raise ImportError("remote execution needs asyncssh: pip install 'ekka[remote]'") from e

from ekka_core.contracts.errors import BadInput, EkkaError, InternalFailure
from ekka_core.contracts.report import Report
from ekka_core.remote import HostURL, RemoteCancelled, RemoteDiagnosis, RemoteRun
from ekka_core.remote.host import PROTOCOL, RESULT_FILES
from ekka_core.report import write_report
from ekka_core.remote.bundle import Bundle, build_bundle

Progress = Callable[[str, str], None]

MIN_PYTHON = (3, 11)                 # the engine uses tomllib
LIGHT_MODULES = ("numpy", "safetensors", "ruptures", "libcst", "rich", "tokenizers", "torch", "transformers")
TARGET_MODULES = {"vllm": ("vllm",), "sglang": ("sglang",)}
RESULTS_LIMIT = 64 << 20             # refuse to fetch a "small" results bundle larger than this
STDERR_TAIL = 40                     # lines of the host process's stderr kept for error messages
KEEPALIVE_S, KEEPALIVE_MAX = 15, 4   # a silent dead link is noticed within about a minute

# Scripts the remote interpreter runs before the engine is there: standalone modules of this package, sent as the
# script on stdin (`python - ARGS`: any login shell, no quoting of code). The engine lives in
# WORKDIR/engine/BUNDLE_NAME/ (the archive, extracted) with a .ekka-bundle.sha256 marker written last.
HOST_PROBE = Path(__file__).resolve().with_name("host_probe.py")        # argv: WORKDIR BUNDLE_NAME SHA256 MODULES
HOST_INSTALL = Path(__file__).resolve().with_name("host_install.py")    # argv: ARCHIVE DEST SHA256

# The host process gets the deployed engine first on PYTHONPATH (the host's own PYTHONPATH after it).
_START = 'PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"; export PYTHONPATH; exec "$2" -u -m ekka_core.remote.host'

_PUT = 'cat > "$1" && mv -f "$1" "$2"'

# TERM the whole process group, wait up to 5 s, then KILL; exit 0 once nothing of the group is left.
_KILL = ('pg=$1; kill -s TERM -- -"$pg" 2>/dev/null || exit 0; i=0; '
         'while kill -s 0 -- -"$pg" 2>/dev/null; do i=$((i+1)); '
         '[ "$i" -eq 50 ] && kill -s KILL -- -"$pg" 2>/dev/null; [ "$i" -ge 100 ] && exit 1; sleep 0.1; done; exit 0')


class _Client(asyncssh.SSHClient):
    def __init__(self) -> None:
        self.lost: BaseException | str | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or "closed"


@dataclass
class _State:
    url: HostURL
    phase: str = "connecting"          # connecting · checking the remote interpreter · deploying … · running
    stage: str = "capture"             # the last pipeline stage the host process reported
    remote_out: str | None = None
    pgid: int | None = None
    hello: dict[str, Any] | None = None
    hello_seen: asyncio.Event = field(default_factory=asyncio.Event)
    host_started: bool = False
    host_ended: bool = False           # its stdout closed (or it said done): nothing left to kill
    stopping: bool = False
    payload: int = 0
    stderr: deque = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))


def run_sync(spec: Any, url: HostURL, **kw: Any) -> RemoteDiagnosis:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_async(spec, url, **kw))
    raise RuntimeError("run_remote_diagnosis() blocks: inside a running event loop await "
                       "ekka_core.remote.run_remote_diagnosis_async(...) instead")


async def run_async(spec: Any, url: HostURL, *, remote_python: str, remote_workdir: str, out_dir_local: Path,
                    fresh: bool, progress: Progress, env: dict[str, str] | None, known_hosts: Any,
                    client_keys: Any, cancel_event: Any, connect_timeout: float) -> RemoteDiagnosis:
    state = _State(url)
    progress("capture", f"connecting to {url.display}")
    connecting = asyncio.ensure_future(_connect(url, known_hosts, client_keys, connect_timeout))
    if cancel_event is not None:
        watch = asyncio.ensure_future(_wait_for(cancel_event))
        try:
            await asyncio.wait([connecting, watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not connecting.done():
                connecting.cancel()
        if not connecting.done() or connecting.cancelled():
            raise RemoteCancelled(f"remote diagnosis on {url.display} cancelled while connecting")
    conn, client = await connecting
    work = asyncio.ensure_future(_run(conn, client, state, spec, remote_python=remote_python,
                                      remote_workdir=remote_workdir, out_dir_local=out_dir_local, fresh=fresh,
                                      progress=progress, env=env))
    watcher = asyncio.ensure_future(_wait_for(cancel_event)) if cancel_event is not None else None
    try:
        try:
            await asyncio.wait([t for t in (work, watcher) if t], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:              # our caller was cancelled (Ctrl-C, an LSP cancel)
            await _stop(conn, client, state, work)
            raise
        if work.done():
            try:
                return work.result()
            except BaseException:
                if not client.lost:                 # a local failure: do not leave the remote run behind
                    await _stop(conn, client, state, work)
                raise
        await _stop(conn, client, state, work)
        where = f"; traces captured so far are kept in {state.remote_out}/traces" if state.remote_out else ""
        raise RemoteCancelled(f"remote diagnosis on {url.display} cancelled during {_doing(state)}"
                              + (f"; remote process group {state.pgid} killed" if state.pgid else "") + where,
                              pgid=state.pgid, remote_out=state.remote_out)
    finally:
        if watcher:
            watcher.cancel()
        if not work.done():
            work.cancel()
        conn.close()
        try:
            await asyncio.wait_for(conn.wait_closed(), 5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing a dead connection
            pass


async def _wait_for(event: Any) -> None:
    while not event.is_set():
        await asyncio.sleep(0.1)


def _doing(state: _State) -> str:
    return state.stage if state.phase == "running" else state.phase


async def _stop(conn: Any, client: _Client, state: _State, work: asyncio.Future) -> None:
    """Kill the host process group (TERM, then KILL) over a second channel; wait for the run to end."""
    state.stopping = True
    if state.host_started and state.pgid is None and not client.lost and not state.host_ended:
        try:
            await asyncio.wait_for(state.hello_seen.wait(), 15)
        except asyncio.TimeoutError:
            pass
    if state.pgid is not None and not client.lost and not state.host_ended:
        try:
            await asyncio.wait_for(conn.run(f"sh -c {shlex.quote(_KILL)} ekka-kill {int(state.pgid)}",
                                            check=False), 30)
        except (asyncio.TimeoutError, asyncssh.Error, OSError):
            pass
    if not work.done():
        await asyncio.wait([work], timeout=10)     # the host's channel closes once its group is gone
    if not work.done():
        work.cancel()
    elif not work.cancelled():
        work.exception()                            # it ends however it ends (killed by TERM): we stopped it


# --- connecting -------------------------------------------------------------------------------------------------

async def _connect(url: HostURL, known_hosts: Any, client_keys: Any, timeout: float) -> tuple[Any, _Client]:
    kw: dict[str, Any] = {"connect_timeout": timeout, "keepalive_interval": KEEPALIVE_S,
                          "keepalive_count_max": KEEPALIVE_MAX}
    if url.port:
        kw["port"] = url.port
    if url.user:
        kw["username"] = url.user
    if known_hosts is not None:
        if not Path(known_hosts).is_file():
            raise BadInput(f"known_hosts file {known_hosts} does not exist",
                           fix="pass an existing known_hosts file, or none to use ~/.ssh/known_hosts")
        kw["known_hosts"] = str(known_hosts)
    if client_keys is not None:
        kw["client_keys"] = [str(k) for k in client_keys]
        kw["agent_path"] = None                     # exactly these keys (like ssh -i … -o IdentitiesOnly=yes)
    try:
        conn, client = await asyncssh.create_connection(_Client, url.host, **kw)
    except asyncssh.HostKeyNotVerifiable as e:
        raise _host_key_error(url, known_hosts, e) from None
    except asyncssh.PermissionDenied:
        who = f"{url.user}@{url.display}" if url.user else url.display
        keys = ", ".join(str(k) for k in client_keys) if client_keys is not None else \
            "your ssh-agent's keys and ~/.ssh/id_*"
        raise BadInput(f"SSH authentication to {who} failed: the server refused {keys}",
                       fix=f"put your public key in ~/.ssh/authorized_keys of that user on {url.host} and check "
                           f"that `{_ssh_cmd(url)}` logs in without a password (ssh-agent: `ssh-add -l`); "
                           "Ekka never asks for passwords") from None
    except asyncssh.KeyImportError as e:
        raise BadInput(f"cannot use the SSH private key ({e})",
                       fix="add an encrypted key to ssh-agent (`ssh-add KEY`) or pass an unencrypted key file") \
            from None
    except (asyncio.TimeoutError, socket.gaierror, OSError) as e:
        reason = "timed out" if isinstance(e, asyncio.TimeoutError) else (e.strerror or str(e))
        raise BadInput(f"cannot connect to {url.display} over SSH ({reason})",
                       fix=f"check the host name and port in the executor URL ({url}) and that `{_ssh_cmd(url)}` "
                           "works from this machine") from None
    except asyncssh.DisconnectError as e:
        raise InternalFailure(f"the SSH server {url.display} closed the connection during login ({e.reason})",
                              fix=f"check that `{_ssh_cmd(url)}` works") from None
    return conn, client


def _ssh_cmd(url: HostURL) -> str:
    return "ssh " + (f"-p {url.port} " if url.port and url.port != 22 else "") + \
        (f"{url.user}@" if url.user else "") + url.host


def _known_hosts_name(url: HostURL) -> str:
    return f"[{url.host}]:{url.port}" if url.port and url.port != 22 else url.host


def _host_key_error(url: HostURL, known_hosts: Any, exc: Exception) -> BadInput:
    path = Path(known_hosts) if known_hosts is not None else Path.home() / ".ssh" / "known_hosts"
    listed = False
    try:
        matches = asyncssh.read_known_hosts(str(path)).match(url.host, url.host, url.port or None)
        listed = bool(matches[0] or matches[1])
    except (OSError, ValueError, asyncssh.Error):
        pass
    name = _known_hosts_name(url)
    if listed:
        return BadInput(
            f"host key for {url.display} does not match known_hosts ({path}): refusing to connect",
            fix=f"if that host was reinstalled or its key rotated, verify the new key's fingerprint with its admin, "
                f"remove the old entry (`ssh-keygen -R '{name}' -f {path}`) and connect once with `{_ssh_cmd(url)}` "
                "to record the new one; otherwise someone may be intercepting the connection")
    return BadInput(f"host {url.display} is not in known_hosts ({path}): refusing to connect to an unverified host",
                    fix=f"connect once with `{_ssh_cmd(url)}` and confirm its key fingerprint (or add it with "
                        f"`ssh-keyscan{' -p ' + str(url.port) if url.port else ''} {url.host} >> {path}` after "
                        "checking the fingerprint)")


# --- the run ----------------------------------------------------------------------------------------------------

def _run_name(spec: Any, env: dict[str, str] | None) -> str:
    """Stable name of the remote output directory: same spec and EKKA_* env → same directory → traces reused."""
    data = {k: v for k, v in spec.to_json().items() if k != "threshold"}
    ekka_env = {k: v for k, v in (env or {}).items() if k.startswith("EKKA_")}
    digest = hashlib.sha256(json.dumps([data, ekka_env], sort_keys=True).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(spec.model).rstrip("/")).name or "model")[:40]
    return f"{stem}-{digest}"


async def _run(conn: Any, client: _Client, state: _State, spec: Any, *, remote_python: str, remote_workdir: str,
               out_dir_local: Path, fresh: bool, progress: Progress, env: dict[str, str] | None) -> RemoteDiagnosis:
    t0 = time.perf_counter()
    url = state.url
    try:
        bundle = build_bundle()
        state.phase = "checking the remote interpreter"
        probe = await _probe(conn, state, remote_python, remote_workdir, bundle, spec)
        uploaded = False
        if not probe["ready"]:
            state.phase = "deploying the engine code"
            progress("capture", f"deploying the engine code ({len(bundle.data) // 1024} KB, "
                                f"{bundle.sha256[:12]}) to {url.display}:{probe['engine']}")
            await _deploy(conn, state, remote_python, probe["engine"], bundle)
            uploaded = True
        else:
            progress("capture", f"engine code up to date on {url.display} ({bundle.sha256[:12]})")
        state.remote_out = f"{probe['workdir']}/runs/{_run_name(spec, env)}"
        state.phase = "running"
        done = await _host(conn, state, probe, spec, fresh, env, progress)
        progress("report", f"fetching the report from {url.display}")
        data = await _download(conn, done["results"], RESULTS_LIMIT)
        state.payload += len(data)
    except (asyncssh.Error, OSError, asyncio.IncompleteReadError, EOFError) as e:
        if client.lost or isinstance(e, (asyncssh.ConnectionLost, ConnectionError, BrokenPipeError, EOFError,
                                         asyncio.IncompleteReadError)):
            raise _lost(state) from None
        raise InternalFailure(f"SSH error talking to {url.display} during {_doing(state)}: {e}") from None
    except EkkaError:
        raise
    if client.lost:
        raise _lost(state)
    paths, summary = _unpack(data, out_dir_local)
    report = Report.load(paths["json"])
    run = RemoteRun(host=str(url), out_dir=done.get("out_dir", state.remote_out), python=probe["python"],
                    python_version=".".join(map(str, probe["version"])),
                    ekka_file=(state.hello or {}).get("ekka_file", ""),
                    plugin_from=(state.hello or {}).get("plugin_from"), bundle_sha256=bundle.sha256,
                    bundle_uploaded=uploaded, trace_bytes=int(done.get("trace_bytes", 0)),
                    bytes_transferred=_wire_bytes(conn), payload_bytes=state.payload,
                    reused_traces=report.meta.reused_traces, seconds=round(time.perf_counter() - t0, 2),
                    summary=summary)
    report.meta.remote = run.to_json()
    paths.update(write_report(report, out_dir_local))       # json with meta.remote; md and html rendered here
    paths["remote"] = out_dir_local / "remote.json"
    paths["remote"].write_text(json.dumps(run.to_json(), indent=1))
    return RemoteDiagnosis(report, paths, run)


def _lost(state: _State) -> InternalFailure:
    host = state.url.display
    if state.phase == "running" and state.remote_out:
        return InternalFailure(
            f"connection to {host} lost during {state.stage}; the remote trace is kept in {state.remote_out}/traces; "
            "re-run to resume (traces are reused)",
            fix="the remote run carries on without this connection and finishes its capture; the same diagnosis "
                "run again waits for it and reuses its traces")
    return InternalFailure(f"connection to {host} lost while {state.phase}; nothing ran remotely yet",
                           fix=f"check the network and that `{_ssh_cmd(state.url)}` works, then run it again")


async def _probe(conn: Any, state: _State, python: str, workdir: str, bundle: Bundle, spec: Any) -> dict[str, Any]:
    mods = list(LIGHT_MODULES) + list(TARGET_MODULES.get(getattr(spec, "target", ""), ()))
    res = await _run_script(conn, python, HOST_PROBE, workdir, bundle.dir_name, bundle.sha256, ",".join(mods))
    out, err = str(res.stdout or ""), str(res.stderr or "")
    state.payload += len(out) + len(err)
    host = state.url.display
    if res.exit_status == 127 or "not found" in err and not out:
        raise BadInput(f"remote python {python!r} was not found on {host}",
                       fix="pass --remote-python with the interpreter of the environment that has torch and vLLM "
                           "there, e.g. /opt/venv/bin/python")
    try:
        probe = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = err.strip()[-600:]
        raise BadInput(f"remote python {python!r} on {host} did not run Ekka's probe (exit {res.exit_status}): {tail}",
                       fix="check --remote-python and --remote-workdir (it must be writable)") from None
    if probe.get("workdir_error"):
        raise BadInput(f"remote working directory on {host}: {probe['workdir_error']}",
                       fix="pass --remote-workdir with a directory the SSH user can write (default "
                           "~/.cache/ekka-remote)")
    if tuple(probe["version"][:2]) < MIN_PYTHON:
        raise BadInput(f"remote python {probe['python']} on {host} is Python {'.'.join(map(str, probe['version']))}",
                       fix=f"point --remote-python at Python ≥ {'.'.join(map(str, MIN_PYTHON))} with torch and vLLM")
    if probe["missing"]:
        raise BadInput(f"remote python {probe['python']} on {host} lacks {', '.join(probe['missing'])}",
                       fix="install them in that environment (pip install …), or point --remote-python at the "
                           "environment that has them")
    return probe


async def _run_script(conn: Any, python: str, script: Path, *args: str) -> Any:
    """``python - ARGS`` on the host with ``script``'s text as the program (stdin)."""
    cmd = " ".join(shlex.quote(a) for a in (python, "-", *args))
    return await conn.run(cmd, input=script.read_text(), check=False)


async def _deploy(conn: Any, state: _State, python: str, dest: str, bundle: Bundle) -> None:
    """Upload the engine archive next to ``dest``, then have the remote check its hash and extract it into ``dest``."""
    archive = f"{dest}.tar.xz.tmp-{secrets.token_hex(4)}"
    await _upload(conn, archive, bundle.data)
    state.payload += len(bundle.data)
    res = await _run_script(conn, python, HOST_INSTALL, archive, dest, bundle.sha256)
    try:
        verdict = json.loads(str(res.stdout or "").strip().splitlines()[-1])
    except (IndexError, ValueError):
        verdict = {"ok": False, "why": str(res.stderr or "")[-600:]}
    if not verdict.get("ok"):
        raise InternalFailure(f"could not install the engine code in {dest} on {state.url.display}: "
                              f"{verdict.get('why', 'extraction failed')}",
                              fix="check that the remote working directory is writable and has free space")


async def _upload(conn: Any, path: str, data: bytes) -> None:
    """Write ``path`` (temporary name, then rename): SFTP, or `cat` where the server has no SFTP."""
    tmp = f"{path}.tmp-{secrets.token_hex(4)}"
    try:
        async with conn.start_sftp_client() as sftp:
            async with sftp.open(tmp, "wb") as f:
                await f.write(data)
            try:
                await sftp.posix_rename(tmp, path)
            except asyncssh.SFTPError:
                await sftp.rename(tmp, path)
        return
    except asyncssh.ChannelOpenError:
        pass                                        # no SFTP subsystem
    q = shlex.quote
    res = await conn.run(f"sh -c {q(_PUT)} ekka-put {q(tmp)} {q(path)}",
                         input=data, encoding=None, check=False)
    if res.exit_status != 0:
        raise InternalFailure(f"could not write {path} on the remote host: {(res.stderr or b'').decode()[-400:]}")


async def _download(conn: Any, path: str, limit: int) -> bytes:
    try:
        async with conn.start_sftp_client() as sftp:
            size = (await sftp.stat(path)).size or 0
            if size > limit:
                raise InternalFailure(f"the remote results bundle {path} is {size} bytes; expected a few KB")
            async with sftp.open(path, "rb") as f:
                return await f.read()
    except asyncssh.ChannelOpenError:
        res = await conn.run(f"cat {shlex.quote(path)}", encoding=None, check=False)
        if res.exit_status != 0:
            raise InternalFailure(f"could not read {path} on the remote host") from None
        return bytes(res.stdout)


async def _host(conn: Any, state: _State, probe: dict[str, Any], spec: Any, fresh: bool,
                 env: dict[str, str] | None, progress: Progress) -> dict[str, Any]:
    """Start the host process, feed it the job, relay its events; return its ``done`` event."""
    host = state.url.display
    cmd = f"sh -c {shlex.quote(_START)} ekka-host {shlex.quote(probe['engine'])} {shlex.quote(probe['python'])}"
    proc = await conn.create_process(cmd, encoding="utf-8", errors="replace")
    state.host_started = True
    job = json.dumps({"protocol": PROTOCOL, "spec": spec.to_json(), "out_dir": state.remote_out,
                      "fresh": bool(fresh), "env": dict(env or {})})
    proc.stdin.write(job + "\n")
    proc.stdin.write_eof()
    state.payload += len(job) + 1

    async def drain_stderr() -> None:
        async for line in proc.stderr:
            state.payload += len(line)
            state.stderr.append(line.rstrip("\n"))

    err_task = asyncio.ensure_future(drain_stderr())
    done: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    try:
        async for line in proc.stdout:
            state.payload += len(line)
            try:
                ev = json.loads(line)
                kind = ev["event"]
            except (ValueError, KeyError, TypeError):
                state.stderr.append(line.rstrip("\n"))   # a library printing to stdout: keep it for errors
                continue
            if kind == "hello":
                state.hello, state.pgid = ev, int(ev["pgid"])
                state.hello_seen.set()
            elif kind == "progress":
                state.stage = ev.get("stage", state.stage)
                if not state.stopping:
                    progress(state.stage, ev.get("message", ""))
            elif kind == "done":
                done = ev
                break                                # fetch now; the host's interpreter exit takes seconds
            elif kind == "error":
                error = ev
        state.host_ended = True
        if done is None:
            await proc.wait_closed()
    finally:
        if done is None:
            try:
                await asyncio.wait_for(err_task, 2)
            except BaseException:  # noqa: BLE001
                err_task.cancel()
        else:
            err_task.cancel()
    if error is not None:
        err = EkkaError.from_json(error)
        detail = "\n" + "\n".join(err.traceback.strip().splitlines()[-6:]) if err.traceback else ""
        raise type(err)(f"on {host}: {err.message}{detail}", fix=err.fix)
    if done is not None:
        return done
    if proc.exit_status is None and proc.exit_signal is None:
        raise ConnectionError("the host process's channel closed without an exit status")
    how = (f"was killed by signal {proc.exit_signal[0]}" if proc.exit_signal
           else f"exited with status {proc.exit_status}")
    tail = "\n".join(state.stderr)[-2000:]
    if state.hello is None:
        raise BadInput(f"Ekka's host process could not start on {host}: it {how}" + (f"\n{tail}" if tail else ""),
                       fix="check that --remote-python runs there and can import the deployed engine")
    raise InternalFailure(f"the remote run on {host} {how} during {state.stage}; its traces are kept in "
                          f"{state.remote_out}/traces" + (f"\n{tail}" if tail else ""))


def _unpack(data: bytes, out_dir: Path) -> tuple[dict[str, Path], dict[str, Any]]:
    """Extract the results bundle into ``out_dir`` (known names only); returns the paths and the remote summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = {n: n for n in (*RESULT_FILES, "report.md", "report.html")} | {"summary.json": "remote-summary.json"}
    for local in names.values():
        (out_dir / local).unlink(missing_ok=True)   # nothing stale from an earlier run survives
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for name in zf.namelist():
            if name in names:
                (out_dir / names[name]).write_bytes(zf.read(name))
    if not (out_dir / "report.json").is_file():
        raise InternalFailure("the remote results bundle has no report.json")
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html",
             "summary": out_dir / "remote-summary.json"}
    if (out_dir / "mapping.json").is_file():
        paths["mapping"] = out_dir / "mapping.json"
    summary = json.loads(paths["summary"].read_text()) if paths["summary"].is_file() else {}
    return paths, summary


def _wire_bytes(conn: Any) -> int | None:
    """Bytes this TCP connection carried, both directions (Linux TCP_INFO: bytes_acked + bytes_received)."""
    sock = conn.get_extra_info("socket")
    if sock is None or not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    except OSError:
        return None
    if len(raw) < 136:
        return None
    acked, received = struct.unpack_from("=QQ", raw, 120)
    return int(acked + received)
