"""The engine's pure-Python code as one deterministic archive (``.tar.xz``), deployed to remote hosts.

The archive holds every file of the ``ekka_core`` package (no ``__pycache__``; package data included; not the
client-only modules, :data:`CLIENT_ONLY`; Python sources without docstrings and whole-line comments, each code line
at its number, :func:`_shipped`) and an
``ekka-<version>.dist-info`` with the ``vllm.general_plugins`` entry point, so a remote interpreter that never
installed Ekka still loads Ekka's vLLM plugin (bug re-injection, tracing in engine subprocesses) once the bundle is
on its ``PYTHONPATH``. Byte-identical for identical sources (fixed timestamps and owners, sorted names), so its
SHA-256 names it and decides whether to upload. The remote extracts it into a directory
(``engine/ekka-<version>-<sha16>/``): code that finds its data through ``__file__`` (the shipped knowledge base)
works unchanged, and bytecode is cached. A solid xz archive, not a zip: the many similar source files compress
together, and the upload counts in a first diagnosis' bytes on the wire (137 KB at 2026-12-03; 194 KB with the
docstrings and comments).
"""

from __future__ import annotations

import ast
import hashlib
import io
import tarfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

import ekka_core

PACKAGE_DIR = Path(ekka_core.__file__).resolve().parent
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
# Code only the user's machine runs: the SSH client, the scripts it sends the host before the engine is there (run
# from this machine's copy), the repro-script importer (a folder: every module under it), the CLI, release
# bisection (it diagnoses each release from here), the benchmark runners (cases, architecture sweep) and the
# tiny-model zoo they build from (the
# host is given a model path; it never builds one), the report's JSON Schema (for the editor's types and the
# tests) and the knowledge base's README. The host runs the pipeline and its host process (remote/host.py); leaving these out
# keeps the one-time upload small (it counts in a first diagnosis' bytes).
CLIENT_ONLY = {"remote/client.py", "remote/host_probe.py", "remote/host_install.py", "repro/", "cli.py", "bisect/",
               "bench.py", "bench_archs.py", "zoo/", "contracts/report.schema.json", "agent/knowledge/README.md"}


def client_only(rel: str) -> bool:
    """Whether the package-relative path ``rel`` (posix) is left out of the bundle."""
    return rel in CLIENT_ONLY or any(rel.startswith(d) for d in CLIENT_ONLY if d.endswith("/"))


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
        if p.suffix in _SKIP_SUFFIXES or client_only(rel.as_posix()):
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


def _shipped(path: Path) -> bytes:
    """A file as the host gets it. Python sources lose their docstrings and whole-line comments, each replaced by
    empty lines, so every code line keeps its number and text (a host traceback points at the same line of this
    checkout): they are a third of the archive (≈194 → 136 KB), and the upload counts in a first diagnosis' bytes on
    the wire. Nothing Ekka runs on the host reads a docstring."""
    data = path.read_bytes()
    if path.suffix != ".py":
        return data
    src = data.decode("utf-8")
    lines = src.splitlines(keepends=True)
    blank: set[int] = set()          # 1-based line numbers emptied
    stub: set[int] = set()           # a docstring that was its body's only statement: "..." keeps it a body
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        first_line = lines[doc.lineno - 1]
        if first_line[:doc.col_offset].strip():      # on the def's own line: left as it is
            continue
        blank.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
        if len(node.body) == 1 and not isinstance(node, ast.Module):
            stub.add(doc.lineno)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        # a comment alone on its line (not a `#` inside a string: tokenize knows the difference)
        if tok.type == tokenize.COMMENT and not tok.line[:tok.start[1]].strip() and tok.start[0] > 2:
            blank.add(tok.start[0])
    out = []
    for number, line in enumerate(lines, 1):
        if number in stub:
            out.append(line[:len(line) - len(line.lstrip())] + "...\n")
        elif number in blank:
            out.append("\n")
        else:
            out.append(line)
    return "".join(out).encode("utf-8")


def build_bundle(package_dir: Path = PACKAGE_DIR) -> Bundle:
    """Archive ``ekka_core`` (pure Python) deterministically; a few hundred milliseconds."""
    entries = [(f"ekka_core/{p.relative_to(package_dir).as_posix()}", _shipped(p)) for p in _files(package_dir)]
    entries += [(name, text.encode()) for name, text in _metadata().items()]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", format=tarfile.PAX_FORMAT, preset=9) as tar:
        for name, data in sorted(entries):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest())


def extract_bundle(archive: Path | str, dest: Path | str) -> None:
    """Extract an engine archive (the host does the same in :mod:`ekka_core.remote.client`'s extraction script)."""
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, **_SAFE)


# Only regular files under the destination (Python ≥ 3.11.4 / 3.12 filter; older interpreters extract as before).
_SAFE = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
