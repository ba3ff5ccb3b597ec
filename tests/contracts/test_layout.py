"""The package layout, checked on the source: a package's ``__init__.py`` is a short docstring and re-exports, the
subpackages of ``ekka_core`` do not import one another in a cycle when they are imported, and the bug cases reach
vLLM only through the compatibility layer (:mod:`ekka_core.capture.vllm_compat`).

Each check is a function of a source root, so that one test can show, on a small fake tree, that each one fails."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "ekka_core"
MAX_INIT_LINES = 60
# What the root package may define besides re-exports: the version and the stage vocabulary.
ROOT_CONSTANTS = {"__version__", "STAGES", "STAGE_WEIGHTS"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


# ---- (a) an __init__.py re-exports ------------------------------------------------------------------------------

def _definitions(tree: ast.Module, allowed: set[str]) -> list[tuple[int, str]]:
    """(line, what) for every top-level statement of a package ``__init__`` that is more than a docstring, an
    import, ``__all__``, a name in ``allowed`` or a tuple of constants."""
    found = []
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue                                                  # the docstring
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not node.orelse and \
                all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            constant_tuple = isinstance(node.value, ast.Tuple) and \
                all(isinstance(e, ast.Constant) for e in node.value.elts)
            if names and len(names) == len(targets) and (names <= {"__all__"} | allowed or constant_tuple):
                continue
        found.append((node.lineno, type(node).__name__ + (f" {node.name}" if hasattr(node, "name") else "")))
    return found


def fat_inits(root: Path) -> list[str]:
    """Every ``__init__.py`` under ``root`` over :data:`MAX_INIT_LINES` lines that defines something."""
    problems = []
    for path in sorted(root.rglob("__init__.py")):
        text = path.read_text(encoding="utf-8")
        allowed = ROOT_CONSTANTS if path.parent == root else set()
        defined = _definitions(ast.parse(text, str(path)), allowed)
        lines = len(text.splitlines())
        if lines > MAX_INIT_LINES and defined:
            what = ", ".join(f"{w} (line {n})" for n, w in defined[:4]) + (" …" if len(defined) > 4 else "")
            problems.append(f"{path.relative_to(root.parent)}: {lines} lines, defines {what}")
    return problems


# ---- (b) no import cycle between subpackages ----------------------------------------------------------------

def _import_time_imports(tree: ast.Module):
    """The imports a module runs when it is imported: module level, inside top-level ``if``/``try``/``with`` and
    class bodies — not inside functions, not under ``if TYPE_CHECKING:``."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            todo[:0] = node.orelse if _is_type_checking(node.test) else node.body + node.orelse
        elif isinstance(node, (ast.Try, ast.With, ast.ClassDef)):
            todo[:0] = [n for block in ("body", "handlers", "orelse", "finalbody") for n in getattr(node, block, [])]
        elif isinstance(node, ast.ExceptHandler):
            todo[:0] = node.body


def subpackage_edges(root: Path) -> dict[tuple[str, str], list[str]]:
    """``(importer, imported)`` top-level parts of ``root`` (``capture``, ``bugs``, ``pipeline`` …) → where."""
    top = {p.name if p.is_dir() else p.stem for p in root.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        source = module.split(".")[1] if "." in module else None
        for node in _import_time_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    kept = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(kept + ([base] if base else []))
                # `from ekka_core import bugs` imports the subpackage; `from ekka_core.x import y` imports x
                targets = [f"{base}.{a.name}" for a in node.names] if base == root.name else [base]
            for target in targets:
                parts = target.split(".")
                if parts[0] != root.name or len(parts) < 2 or parts[1] not in top or parts[1] == source or \
                        source is None:
                    continue
                edges.setdefault((source, parts[1]), []).append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return edges


def import_cycles(root: Path) -> list[list[str]]:
    """The strongly connected groups of more than one subpackage in the import-time import graph (Tarjan)."""
    edges = subpackage_edges(root)
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _cycle_words(root: Path, group: list[str]) -> str:
    edges = subpackage_edges(root)
    inside = [f"{a} → {b} ({', '.join(where[:2])})" for (a, b), where in sorted(edges.items())
              if a in group and b in group]
    return f"{' ↔ '.join(group)}: " + "; ".join(inside)


# ---- (c) the bug cases reach vLLM through the compatibility layer ----------------------------------------------

def _dynamic_import_of(call: ast.Call) -> str:
    """What ``importlib.import_module(…)`` / ``__import__(…)`` imports, as far as its literal start says."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in ("import_module", "__import__") or not call.args:
        return ""
    arg = call.args[0]
    if isinstance(arg, ast.JoinedStr) and arg.values:
        arg = arg.values[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""


def direct_vllm_imports(package: Path) -> list[str]:
    """Every import of ``vllm`` in ``package``, function-local and dynamic ones included."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            where = f"{path.relative_to(package.parent)}:{getattr(node, 'lineno', 0)}"
            problems += [f"{where}: imports {n}" for n in names if n.split(".")[0] == "vllm"]
            if isinstance(node, ast.Call) and _dynamic_import_of(node).split(".")[0] == "vllm":
                problems.append(f"{where}: imports vllm dynamically (use ekka_core.capture.vllm_compat.resolve)")
    return problems


# ---- the checks on ekka_core ------------------------------------------------------------------------------------

def test_package_inits_only_re_export():
    assert len(list(CORE.rglob("__init__.py"))) > 15
    problems = fat_inits(CORE)
    assert problems == [], "split these into modules named for what they hold, and re-export:\n" + "\n".join(problems)


def test_no_import_cycle_between_subpackages():
    edges = subpackage_edges(CORE)
    assert ("analysis", "align") in edges and ("mapping", "tree") in edges   # the walker sees the stages' imports
    cycles = import_cycles(CORE)
    assert cycles == [], "\n".join(_cycle_words(CORE, g) for g in cycles)


def test_the_bug_registry_imports_nothing_from_capture():
    """The vLLM plugin (in capture) imports the registry; the registry must not import capture back."""
    code = ("import sys; from ekka_core.bugs import BUGS; assert BUGS; "
            "print(sorted(m for m in sys.modules if m.startswith('ekka_core.capture')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_bug_cases_import_vllm_only_through_the_compatibility_layer():
    problems = direct_vllm_imports(CORE / "bugs")
    assert problems == [], "\n".join(problems)


# ---- each check can fail ----------------------------------------------------------------------------------------

def test_each_check_fails_on_a_tree_that_breaks_it(tmp_path):
    root = tmp_path / "ekka_core"
    files = {
        "__init__.py": '"""root"""\n__version__ = "1"\nSTAGES = ("a", "b")\n',
        "capture/__init__.py": "from ekka_core.capture.plugin import register\n",
        "capture/plugin.py": "from ekka_core import bugs\n\n\ndef register():\n    pass\n",
        "bugs/__init__.py": '"""bugs"""\n' + "from .cases import BUGS\n" + "\n" * 60 + "def get(name):\n    pass\n",
        "bugs/cases.py": ("from typing import TYPE_CHECKING\n\nfrom ekka_core.capture import vllm_compat\n"
                          "if TYPE_CHECKING:\n    from ekka_core import tree\n"
                          "BUGS = {}\n\n\ndef inject():\n    from vllm import envs\n    import importlib\n"
                          "    importlib.import_module(f'vllm.{envs}')\n    importlib.import_module(f'{envs}')\n"),
        "tree/__init__.py": '"""tree"""\n' + "from ekka_core.bugs import BUGS\n" * 70 + "__all__ = ['BUGS']\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    fat = fat_inits(root)
    assert len(fat) == 1 and fat[0].startswith("ekka_core/bugs/__init__.py") and "FunctionDef get" in fat[0]
    assert import_cycles(root) == [["bugs", "capture"]]                  # bugs → tree only under TYPE_CHECKING
    assert ("tree", "bugs") in subpackage_edges(root) and ("bugs", "tree") not in subpackage_edges(root)
    assert [p.split(": ", 1)[1] for p in direct_vllm_imports(root / "bugs")] == [
        "imports vllm", "imports vllm dynamically (use ekka_core.capture.vllm_compat.resolve)"]


# ---- one stage vocabulary -----------------------------------------------------------------------------------------

def test_progress_is_reported_under_the_stages_and_the_percentages_follow_their_weights():
    """``ekka_core.STAGES`` is the only list of stage names: every ``progress(stage, message)`` call names one, and
    the language server's percentages come from the stages' weights (capture 0–70, tree 70, mapping 75, align 80,
    analysis 85, report 95: server/protocol.py's documentation)."""
    from ekka_core import STAGE_WEIGHTS, STAGES
    from server.protocol import STAGE_START, stage_percent

    assert sum(STAGE_WEIGHTS.values()) == 100 and STAGES == tuple(STAGE_WEIGHTS)
    assert STAGE_START == {"capture": 0, "tree": 70, "mapping": 75, "align": 80, "analysis": 85, "report": 95}
    percents = [stage_percent(stage, n) for stage in STAGES for n in range(4)]
    assert percents == sorted(percents) and percents[-1] < 100
    reported = set()
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            func = node.func if isinstance(node, ast.Call) else None
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "progress" and len(node.args) == 2 and isinstance(node.args[0], ast.Constant):
                reported.add(node.args[0].value)
    assert {"capture", "tree", "report"} <= reported and reported <= set(STAGES), reported
