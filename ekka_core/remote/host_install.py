"""Run on the remote host after the engine archive was uploaded: ``python - ARCHIVE DEST SHA256`` (this file as the
script, sent on stdin by :mod:`ekka_core.remote.client`). Standard library only.

Checks the archive's hash, extracts it beside DEST, writes the ``.ekka-bundle.sha256`` marker, renames the result
into place (atomic; a concurrent client that got there first wins) and removes the archive. Prints one JSON line:
``{"ok": true}`` or ``{"ok": false, "why"}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile

MARKER = ".ekka-bundle.sha256"


def _complete(dest: str, want: str) -> bool:
    try:
        with open(os.path.join(dest, MARKER)) as f:
            return f.read().strip() == want
    except OSError:
        return False


def install(archive: str, dest: str, want: str) -> dict:
    with open(archive, "rb") as f:
        got = hashlib.sha256(f.read()).hexdigest()
    if got != want:
        os.remove(archive)
        return {"ok": False, "why": f"uploaded engine archive has sha256 {got[:16]}, expected {want[:16]}"}
    tmp = os.path.join(os.path.dirname(dest), "." + os.path.basename(dest) + ".tmp-" + str(os.getpid()))
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive, "r:xz") as t:
        # Only regular files under the destination (Python ≥ 3.11.4 / 3.12 filter).
        t.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # type: ignore[arg-type]
    with open(os.path.join(tmp, MARKER), "w") as f:
        f.write(want + "\n")
    if os.path.isdir(dest) and not _complete(dest, want):
        shutil.rmtree(dest, ignore_errors=True)   # an interrupted earlier extraction (no marker)
    try:
        os.rename(tmp, dest)
    except OSError:                                # another client installed the same engine meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    os.remove(archive)
    return {"ok": _complete(dest, want)}


if __name__ == "__main__":
    print(json.dumps(install(*sys.argv[1:4])))
