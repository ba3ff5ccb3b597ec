"""Remote execution: diagnose on a GPU host over SSH, bring back only the report.

::

    from ekka_core.remote import run_remote_diagnosis
    d = run_remote_diagnosis(spec, "ssh://me@gpu-box", remote_python="/opt/venv/bin/python",
                             remote_workdir="~/.cache/ekka-remote", out_dir_local=Path("ekka-out/x"),
                             fresh=False, progress=lambda stage, msg: print(stage, msg))
    d.report.verdict, d.paths["json"], d.remote.bytes_transferred

What happens (:mod:`ekka_core.remote.client`): connect with the user's SSH keys / agent and ``known_hosts`` (host-key
verification always on); deploy the engine's pure-Python code (:mod:`ekka_core.remote.bundle`: a ~150 KB
deterministic archive named by its SHA-256, uploaded by SFTP only when the host lacks that exact version, checked
against its hash and extracted there into ``REMOTE_WORKDIR/engine/ekka-<version>-<sha16>/``); start ``python -m
ekka_core.remote.host`` there with that directory first on ``PYTHONPATH`` and the host's own torch / vLLM /
SGLang (the bundle's dist-info declares Ekka's vLLM plugin, so nothing is pip-installed there); that process runs
capture and analysis on the host (tensors never leave it) and streams progress; the client fetches
report.json/md/html, mapping.json and a summary (a few tens of KB), never traces.

``spec.model`` is a path **on the remote host**. The remote output directory is
``REMOTE_WORKDIR/runs/<model>-<hash of spec and EKKA_* env>``: the same diagnosis run again lands in the same
directory and reuses its traces.

The entry points and what they return: :mod:`~ekka_core.remote.diagnosis`, which imports only the standard library,
so the host process (which lives in this package) starts without asyncssh; the client part is imported when an
entry point is called.
"""

from ekka_core.remote.diagnosis import (DEFAULT_REMOTE_PYTHON, DEFAULT_REMOTE_WORKDIR, HostURL, Progress,
                                        RemoteCancelled, RemoteDiagnosis, RemoteRun, parse_host_url,
                                        run_remote_diagnosis, run_remote_diagnosis_async)

__all__ = ["run_remote_diagnosis", "run_remote_diagnosis_async", "parse_host_url", "HostURL", "RemoteRun",
           "RemoteDiagnosis", "RemoteCancelled", "DEFAULT_REMOTE_PYTHON", "DEFAULT_REMOTE_WORKDIR"]
