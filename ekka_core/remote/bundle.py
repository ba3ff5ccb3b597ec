"""The engine's pure-Python code as one deterministic zip, deployed to remote hosts.

The zip holds every file of the ``ekka_core`` package (no ``__pycache__``; package data included) and an
``ekka-<version>.dist-info`` with the ``vllm.general_plugins`` entry point, so a remote interpreter that never
installed Ekka still loads Ekka's vLLM plugin (bug re-injection, tracing in engine subprocesses) once the bundle is
on its ``PYTHONPATH``. Byte-identical for identical sources (fixed timestamps, sorted names), so its SHA-256 names
it and decides whether to upload. The remote extracts it into a directory (``engine/ekka-<version>-<sha16>/``)
rather than importing from the zip: code that finds its data through ``__file__`` (the shipped knowledge base)
works unchanged, and bytecode is cached. The zip itself also works on ``PYTHONPATH`` (``scripts/gpu-check.sh``).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import ekka_core

PACKAGE_DIR = Path(ekka_core.__file__).resolve().parent
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str

    @property
    def dir_name(self) -> str:
        """Name of the remote directory the zip is extracted into (version and content hash)."""
        return f"ekka-{ekka_core.__version__}-{self.sha256[:16]}"


def _files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_dir() or any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts):
            continue
        if p.suffix in _SKIP_SUFFIXES:
            continue
        out.append(p)
    return out


def _metadata() -> dict[str, str]:
    version = ekka_core.__version__
    dist = f"ekka-{version}.dist-info"
    return {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: ekka\nVersion: {version}\n"
                            "Summary: Ekka engine code deployed for remote execution (pure Python)\n",
        f"{dist}/entry_points.txt": "[vllm.general_plugins]\nekka = ekka_core.capture.vllm_plugin:register\n",
        f"{dist}/top_level.txt": "ekka_core\n",
    }


def build_bundle(package_dir: Path = PACKAGE_DIR) -> Bundle:
    """Zip ``ekka_core`` (pure Python, a few hundred KB) deterministically; a few tens of milliseconds."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        entries = [(f"ekka_core/{p.relative_to(package_dir).as_posix()}", p.read_bytes())
                   for p in _files(package_dir)]
        entries += [(name, text.encode()) for name, text in _metadata().items()]
        for name, data in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data, compresslevel=9)
    data = buf.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest())
