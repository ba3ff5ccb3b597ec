"""A remote diagnosis as the caller sees it: the executor URL (:func:`parse_host_url`), the entry points
(:func:`run_remote_diagnosis`, :func:`run_remote_diagnosis_async`: the SSH client, :mod:`ekka_core.remote.client`,
is imported when one is called) and what they return (:class:`RemoteDiagnosis`, :class:`RemoteRun`).

Imports only the standard library and the error contract, so the host process (which lives in this package) starts
without asyncssh."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

from ekka_core.contracts.errors import BadInput, InternalFailure

if TYPE_CHECKING:
    from ekka_core.contracts.report import Report
    from ekka_core.contracts.spec import DiagnosisSpec

DEFAULT_REMOTE_PYTHON = "python3"
DEFAULT_REMOTE_WORKDIR = "~/.cache/ekka-remote"
Progress = Callable[[str, str], None]


class RemoteCancelled(InternalFailure):
    """The caller cancelled a remote diagnosis; the remote process group was killed. Exit code 3."""

    def __init__(self, message: str, *, pgid: int | None = None, remote_out: str | None = None,
                 fix: str | None = None):
        super().__init__(message, fix=fix)
        self.pgid = pgid                    # the remote process group that was killed (None: none had started)
        self.remote_out = remote_out        # the remote output directory (partial traces stay there)


@dataclass(frozen=True)
class HostURL:
    host: str
    port: int | None = None
    user: str | None = None

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ssh://{user}{host}" + (f":{self.port}" if self.port else "")

    @property
    def display(self) -> str:
        """``host`` or ``host:port`` as people write it in messages."""
        return self.host + (f":{self.port}" if self.port and self.port != 22 else "")


@dataclass
class RemoteRun:
    """Where and how a remote diagnosis ran; also written to ``OUT/remote.json``."""
    host: str
    out_dir: str                       # remote output directory (traces stay there)
    python: str
    python_version: str
    ekka_file: str                     # where the remote imported ekka_core from (the deployed engine)
    plugin_from: str | None            # where vLLM there loads Ekka's plugin from (None: not found)
    bundle_sha256: str
    bundle_uploaded: bool
    trace_bytes: int                   # size of the remote traces
    bytes_transferred: int | None      # SSH bytes on the wire, both directions (None where the OS cannot tell)
    payload_bytes: int                 # application bytes moved (upload + stdout/stderr + fetched results)
    reused_traces: bool
    seconds: float
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("summary")
        return d


@dataclass
class RemoteDiagnosis:
    """Same shape as :class:`ekka_core.pipeline.Diagnosis` (``report``, ``paths``) plus :attr:`remote`.

    ``paths``: ``json``, ``md``, ``html`` (as the pipeline's), ``mapping`` when the run mapped components,
    ``summary`` (the remote summary: trace sizes, stage timings, capture log tails) and ``remote`` (remote.json).
    ``report.meta.remote`` says which host ran it: suspects' ``file`` paths are paths on that host.
    """
    report: "Report"
    paths: dict[str, Path]
    remote: RemoteRun


def parse_host_url(url: str) -> HostURL:
    """``ssh://[user@]host[:port]`` (or plain ``[user@]host``) → :class:`HostURL`; anything else is bad input."""
    text = url.strip()
    fix = "write the executor as ssh://[user@]host[:port], e.g. ssh://me@gpu-box or ssh://gpu-box:2222"
    if "://" not in text:
        text = "ssh://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise BadInput(f"executor URL {url!r} is not valid ({e})", fix=fix) from None
    if parts.scheme != "ssh":
        raise BadInput(f"executor URL {url!r} uses scheme {parts.scheme!r}; only ssh:// is supported", fix=fix)
    if parts.password is not None:
        raise BadInput(f"executor URL {url!r} contains a password",
                       fix="remove it: Ekka authenticates with your SSH keys or ssh-agent, never passwords")
    if not parts.hostname:
        raise BadInput(f"executor URL {url!r} names no host", fix=fix)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise BadInput(f"executor URL {url!r} has a path or query", fix=fix + " (set the remote directory with "
                       "--remote-workdir)")
    return HostURL(parts.hostname, port, parts.username or None)


def run_remote_diagnosis(spec: "DiagnosisSpec", host_url: str, *, remote_python: str = DEFAULT_REMOTE_PYTHON,
                         remote_workdir: str = DEFAULT_REMOTE_WORKDIR, out_dir_local: Path | str,
                         fresh: bool = False, progress: Progress = lambda stage, msg: None,
                         env: dict[str, str] | None = None, known_hosts: str | Path | None = None,
                         client_keys: list[str | Path] | None = None, cancel_event: Any = None,
                         connect_timeout: float = 30.0) -> RemoteDiagnosis:
    """Run one diagnosis on ``host_url`` and return its report, fetched into ``out_dir_local``. Blocking.

    * ``progress(stage, message)``: stages are :data:`ekka_core.STAGES` (connecting and deploying report
      as ``capture``, fetching the results as ``report``), called on the calling thread.
    * ``env``: environment for the remote run (e.g. ``{"EKKA_INJECT_BUG": name}``, ``CUDA_VISIBLE_DEVICES``);
      ``EKKA_*`` variables are part of the trace-reuse fingerprint, as locally. Nothing of the local environment
      is forwarded otherwise: the mapping agent runs on the host, so pass ``ANTHROPIC_API_KEY`` here if it should
      call the API from there (it travels in the job over the SSH channel and is never written to disk); its
      knowledge base is the host's ``~/.cache/ekka/knowledge``.
    * ``known_hosts``: a known_hosts file (default: ``~/.ssh/known_hosts`` and your ssh config). Verification is
      never turned off: an unknown host or a changed key is refused with the command that fixes it.
    * ``client_keys``: private key files to use *instead of* ssh-agent and ``~/.ssh/id_*`` (default: those).
    * ``cancel_event``: anything with ``is_set()`` (``threading.Event``); once set, the remote process group is
      killed and :class:`RemoteCancelled` is raised. Ctrl-C (KeyboardInterrupt) does the same, then re-raises.

    Raises :class:`~ekka_core.contracts.errors.BadInput` (exit 2: host key, credentials, remote interpreter, the spec as seen
    on the host) or :class:`~ekka_core.contracts.errors.InternalFailure` (exit 3: a lost connection — the remote run goes on
    and a re-run reuses its traces —, a crashed remote run). Must not be called from a running event loop: await
    :func:`run_remote_diagnosis_async` there.
    """
    from ekka_core.remote.client import run_sync
    return run_sync(spec, parse_host_url(host_url), remote_python=remote_python, remote_workdir=remote_workdir,
                    out_dir_local=Path(out_dir_local), fresh=fresh, progress=progress, env=env,
                    known_hosts=known_hosts, client_keys=client_keys, cancel_event=cancel_event,
                    connect_timeout=connect_timeout)


async def run_remote_diagnosis_async(spec: "DiagnosisSpec", host_url: str, *,
                                     remote_python: str = DEFAULT_REMOTE_PYTHON,
                                     remote_workdir: str = DEFAULT_REMOTE_WORKDIR, out_dir_local: Path | str,
                                     fresh: bool = False, progress: Progress = lambda stage, msg: None,
                                     env: dict[str, str] | None = None, known_hosts: str | Path | None = None,
                                     client_keys: list[str | Path] | None = None, cancel_event: Any = None,
                                     connect_timeout: float = 30.0) -> RemoteDiagnosis:
    """:func:`run_remote_diagnosis` for callers inside an event loop (the language server). Cancelling the awaiting
    task kills the remote process group too (then ``CancelledError`` propagates); ``progress`` runs on the loop."""
    from ekka_core.remote.client import run_async
    return await run_async(spec, parse_host_url(host_url), remote_python=remote_python,
                           remote_workdir=remote_workdir, out_dir_local=Path(out_dir_local), fresh=fresh,
                           progress=progress, env=env, known_hosts=known_hosts, client_keys=client_keys,
                           cancel_event=cancel_event, connect_timeout=connect_timeout)
