"""Fills extension/bundled/ with the Python side of the extension (à la ruff-vscode / esbonio ``bundled/libs``).

    bundled/tool/lsp_server.py      entry (from extension/python/lsp_server.py)
    bundled/tool/server/            the language server package (../server/*.py)
    bundled/libs/ekka_core/         the part of ekka_core the server imports (found by following its imports)
    bundled/libs/<dist>             pygls, lsprotocol, cattrs, attrs, typing_extensions: copied from the
                                    environment running this script (the versions the tests ran with)

Run with the project's interpreter (``node scripts/bundle-python.mjs`` finds it). Offline: nothing is downloaded.
Refuses a distribution with compiled files (the bundle must be pure Python: torch & co stay with the user's
interpreter), then checks that the bundled server imports with ``python -S`` (no site-packages at all).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

EXT = Path(__file__).resolve().parent.parent
REPO = EXT.parent
OUT = EXT / "bundled"
DISTS = ("pygls", "lsprotocol", "cattrs", "attrs", "typing_extensions")
SKIP_META = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
COMPILED = (".so", ".pyd", ".dylib", ".dll")


def say(msg: str) -> None:
    print(f"[bundle-python] {msg}", file=sys.stderr)


def ekka_imports(path: Path) -> set[str]:
    """Every ``ekka_core[.x]`` module a file imports (at any depth: the server imports lazily)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ekka_core"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "ekka_core":
            found.add(node.module)
            # `from ekka_core import spec` may name a submodule
            for a in node.names:
                if (REPO / node.module.replace(".", "/") / f"{a.name}.py").exists() \
                        or (REPO / node.module.replace(".", "/") / a.name / "__init__.py").exists():
                    found.add(f"{node.module}.{a.name}")
    return found


def module_file(name: str) -> Path:
    base = REPO / name.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def ekka_closure(start: list[Path]) -> list[Path]:
    todo = set().union(*(ekka_imports(p) for p in start))
    done: set[str] = set()
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):             # parent packages' __init__
            todo.add(".".join(parts[:i]))
        f = module_file(name)
        if not f.exists():
            raise SystemExit(f"[bundle-python] the server imports {name}, but {f} does not exist")
        todo |= ekka_imports(f) - done
    return sorted({module_file(n) for n in done})


def copy_dist(name: str, dest: Path) -> str:
    dist = md.distribution(name)
    files = [f for f in (dist.files or []) if "__pycache__" not in f.parts and not str(f).endswith(".pyc")]
    compiled = [str(f) for f in files if str(f).endswith(COMPILED)]
    if compiled:
        raise SystemExit(f"[bundle-python] {name} {dist.version} is not pure Python ({compiled[0]}): not bundled")
    n = 0
    for f in files:
        if f.parts[0] == ".." or (f.parts[0].endswith(".dist-info") and f.name in SKIP_META):
            continue                                # console scripts in bin/, install bookkeeping
        src = Path(dist.locate_file(f))
        if not src.is_file():
            continue
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        n += 1
    return f"{name}=={dist.version} ({n} files)"


def main() -> int:
    if sys.version_info < (3, 11):
        raise SystemExit("[bundle-python] run this with Python 3.11+ (the project's .venv)")
    shutil.rmtree(OUT, ignore_errors=True)
    tool, libs = OUT / "tool", OUT / "libs"
    (tool / "server").mkdir(parents=True)
    libs.mkdir(parents=True)

    shutil.copy2(EXT / "python" / "lsp_server.py", tool / "lsp_server.py")
    server_files = sorted((REPO / "server").glob("*.py"))
    if not server_files:
        raise SystemExit(f"[bundle-python] no server package at {REPO / 'server'}")
    for f in server_files:
        shutil.copy2(f, tool / "server" / f.name)
    say(f"server: {', '.join(f.name for f in server_files)}")

    # engine_process.py runs in the user's environment (full ekka_core, torch, the engine), never in the server
    # process: the closure of what the server imports leaves it (and the pipeline it imports) out.
    core = ekka_closure([f for f in server_files if f.name != "engine_process.py"])
    for f in core:
        target = libs / f.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    if (REPO / "ekka_core" / "py.typed").exists():
        shutil.copy2(REPO / "ekka_core" / "py.typed", libs / "ekka_core" / "py.typed")
    say(f"ekka_core: {', '.join(str(f.relative_to(REPO / 'ekka_core')) for f in core)}")

    for name in DISTS:
        say(copy_dist(name, libs))

    # The bundle alone must be enough for the server process: no site-packages (-S), no user PYTHONPATH (-E),
    # and no __pycache__ written into the bundle (-B).
    check = ("import runpy, sys; sys.argv = [sys.argv[0]]; "
             f"sys.path[0:0] = [{str(tool)!r}, {str(libs)!r}]; "
             "import server.server, ekka_core.contracts.spec, ekka_core.contracts.errors, pygls, lsprotocol; "
             "from server.protocol import heavy_modules; assert not heavy_modules(), heavy_modules(); "
             "assert all(m.__file__.startswith(" + repr(str(OUT)) + ") for m in (server.server, ekka_core.contracts.spec, pygls, lsprotocol))")
    subprocess.run([sys.executable, "-S", "-E", "-B", "-c", check], check=True)
    say(f"import check passed (python -S); bundle in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
