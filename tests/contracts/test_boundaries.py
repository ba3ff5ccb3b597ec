"""Boundaries between the stages and the processes, checked on the source: no module reaches into another
subpackage's private names, the torch-free layers import nothing heavy, and the language server never loads torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ekka_core", "server")
HEAVY = ("torch", "vllm", "transformers", "sglang", "numpy", "safetensors", "ruptures")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _subpackage(module: str) -> str:
    """``ekka_core.align.custom`` → ``ekka_core.align``; a top-level module (``ekka_core.cli``) is its own."""
    return ".".join(module.split(".")[:2])


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports(module: str, path: Path, modules: dict[str, Path]):
    """(line, imported module, imported name or None) for every import, relative ones resolved."""
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                yield node.lineno, base, a.name


def test_no_module_imports_a_private_name_of_another_subpackage():
    modules = _modules()
    assert "ekka_core.align" in modules and "server.server" in modules and len(modules) > 60
    problems = []
    for module, path in modules.items():
        for line, target, name in _imports(module, path, modules):
            if target.split(".")[0] not in PACKAGES or _subpackage(target) == _subpackage(module):
                continue
            private_module = next((p for p in target.split(".")[1:] if _private(p)), None)
            where = f"{path.relative_to(REPO)}:{line}"
            if private_module:
                problems.append(f"{where}: imports from the private module {target}")
            elif name is not None and _private(name):
                problems.append(f"{where}: imports the private {target}.{name}")
    assert problems == [], "\n".join(problems)


def test_the_walker_sees_a_private_reach_in(tmp_path):
    """The check above must be able to fail: a reach-in written the way the agent used to import align's."""
    fake = tmp_path / "ekka_core" / "agent" / "tensors.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ekka_core.align import _gather, is_float\nfrom . import _sibling\n")
    (tmp_path / "ekka_core" / "agent" / "__init__.py").write_text("")
    modules = {"ekka_core.agent.tensors": fake, "ekka_core.agent": tmp_path / "ekka_core/agent/__init__.py"}
    found = [(t, n) for _, t, n in _imports("ekka_core.agent.tensors", fake, modules)]
    assert ("ekka_core.align", "_gather") in found and ("ekka_core.agent", "_sibling") in found
    assert _subpackage("ekka_core.align") != _subpackage("ekka_core.agent.tensors")


def test_the_contracts_and_the_server_import_nothing_heavy_at_module_level():
    """contracts/ is the torch-free layer; the server, its engine-process protocol and settings read only it."""
    modules = _modules()
    light = [m for m in modules if m.startswith("ekka_core.contracts")] + \
        ["server.server", "server.protocol", "server.jobs", "server.present", "server.settings",
         "ekka_core.remote", "ekka_core.remote.diagnosis", "ekka_core.remote.host", "ekka_core.remote.host_probe",
         "ekka_core.remote.host_install", "ekka_core.align.sandbox_child"]
    problems = []
    for module in light:
        tree = ast.parse(modules[module].read_text(encoding="utf-8"))
        for node in tree.body:                     # module level only: lazy imports inside functions are the point
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                if n.split(".")[0] in HEAVY and not (module == "ekka_core.align.sandbox_child"):
                    problems.append(f"{module}: imports {n}")
                if module.startswith("ekka_core.contracts") and n.startswith("ekka_core.") \
                        and not n.startswith("ekka_core.contracts"):
                    problems.append(f"{module}: imports {n} (contracts import only contracts)")
    assert problems == [], problems


def test_the_sandbox_child_and_the_host_scripts_are_standalone():
    """Run as files by another interpreter, they import neither Ekka nor anything but their declared libraries."""
    modules = _modules()
    allowed = {"ekka_core.align.sandbox_child": {"numpy", "safetensors", "_socket", "socket"},
               "ekka_core.remote.host_probe": set(), "ekka_core.remote.host_install": set()}
    for module, extra in allowed.items():
        tops = {(t or "").split(".")[0] for _, t, _ in _imports(module, modules[module], modules)}
        stdlib = set(sys.stdlib_module_names) | {"__future__"}
        assert tops - stdlib - extra == set(), (module, tops - stdlib - extra)


def test_the_language_server_process_never_imports_torch():
    """Everything the server does before handing a job to the engine process — spec files, repro scripts, settings,
    presenting a report — in a fresh interpreter, then the list of heavy modules loaded."""
    code = r"""
import json, sys, tempfile, pathlib
import server.server as srv
from server.settings import Settings
from server.present import Result, diagnostics
from ekka_core.contracts.report import Report, headline, short_headline
d = pathlib.Path(tempfile.mkdtemp())
(d / "s.ekka.toml").write_text('model = "m"\nprompts = ["p"]\n')
(d / "r.py").write_text('from vllm import LLM\nLLM(model="m").generate("hi")\n')
srv.resolve_spec({}, str(d / "s.ekka.toml"), str(d))
srv.resolve_spec({}, str(d / "r.py"), str(d))
Settings().update({"settings": [{"workspace": str(d), "engineArgs": {"max_num_seqs": 2}}]})
report = Report.from_json({"verdict": "divergent", "checked": 1, "threshold": 2.0, "suspects": [
    {"rank": 1, "target": {"module": "m.a", "class": "A", "file": str(d / "r.py"), "line": 1},
     "reference": {"modules": ["m.a"]}, "error_ratio": 9.0, "onset_token": 0, "evidence": "x"}]})
headline(report), short_headline(report)
diagnostics(Result("j", report, modules={}, paths={}, out_dir=str(d), uri=None), lambda p, l: None)
from server.protocol import heavy_modules
print(json.dumps(heavy_modules()))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
