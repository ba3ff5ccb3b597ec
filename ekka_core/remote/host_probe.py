"""Run on the remote host before anything is deployed: ``python - WORKDIR BUNDLE_NAME SHA256 MODULES`` (this file
as the script, sent on stdin by :mod:`ekka_core.remote.client`). Standard library only: Ekka is not there yet.

Creates ``WORKDIR/engine`` and ``WORKDIR/runs``; says whether the engine ``WORKDIR/engine/BUNDLE_NAME/`` is
installed (its ``.ekka-bundle.sha256`` marker, written last, equals SHA256) and marks it used; removes engines
unused for a week; lists which of the comma-separated MODULES the interpreter cannot import. Prints one JSON line:
``{"python", "version", "workdir", "engine", "ready", "missing"}``, or ``{"workdir_error", "workdir"}``.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import sys
import time

STALE_S = 7 * 86400
MARKER = ".ekka-bundle.sha256"


def probe(workdir: str, bundle_name: str, sha256: str, modules: str) -> dict:
    wd = os.path.abspath(os.path.expanduser(workdir))
    engine = os.path.join(wd, "engine")
    try:
        os.makedirs(engine, exist_ok=True)
        os.makedirs(os.path.join(wd, "runs"), exist_ok=True)
    except OSError as e:
        return {"workdir_error": f"cannot create {wd}: {e.strerror or e}", "workdir": wd}
    dest = os.path.join(engine, bundle_name)
    ready = False
    try:
        with open(os.path.join(dest, MARKER)) as f:
            ready = f.read().strip() == sha256
    except OSError:
        pass
    if ready:
        os.utime(dest)                    # mtime = last use: engines unused for a week are removed below
    for old in glob.glob(os.path.join(engine, "*")) + glob.glob(os.path.join(engine, ".*.tmp-*")):
        try:
            if old != dest and os.path.getmtime(old) < time.time() - STALE_S:
                shutil.rmtree(old) if os.path.isdir(old) else os.remove(old)
        except OSError:
            pass
    missing = []
    for m in filter(None, modules.split(",")):
        try:
            if importlib.util.find_spec(m) is None:
                missing.append(m)
        except Exception:  # noqa: BLE001 - a package that fails to even be found is missing
            missing.append(m)
    return {"python": sys.executable, "version": list(sys.version_info[:3]), "workdir": wd, "engine": dest,
            "ready": ready, "missing": missing}


if __name__ == "__main__":
    print(json.dumps(probe(*sys.argv[1:5])))
