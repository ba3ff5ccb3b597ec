"""Report, reference-scores and engine-outputs data is read through its dataclasses, never by string key.

Every ``.py`` under ``ekka_core/`` and ``server/`` but the contracts themselves is parsed, and a string-constant
subscript ``x["key"]`` or ``x.get("key")`` / ``x.setdefault("key", …)`` / ``x.pop("key")`` fails the test when
``key`` is a JSON field name of the contracts in :data:`CONTRACTS` and the access is to their data:

* a *distinctive* key (every field name but :data:`GENERIC`) means report / scores / outputs data wherever it is
  read (``d["verdict"]``, ``s.get("onset_token")``), unless :data:`ALLOWED` names the file and key;
* a :data:`GENERIC` key (a word other JSON shapes use too: ``model``, ``file``, ``target``, ``message``) counts only
  when the base is recognisably that data: a name or attribute called ``report`` / ``scores`` / ``outputs`` (or
  ending ``_report`` …), a value read from one (``report["suspects"][0]``, ``report.get("meta", {})``), an
  expression that reads ``report.json`` / ``outputs.json`` / ``reference-scores.json``, or a name bound in the same
  function from any of those (``for s in report["suspects"]: s["target"]``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
from pathlib import Path

from ekka_core.contracts.jsonable import json_name

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("ekka_core", "server")
EXEMPT = (REPO / "ekka_core" / "contracts",)
CONTRACTS = ("ekka_core.contracts.report", "ekka_core.contracts.scores", "ekka_core.contracts.serving")
ACCESSORS = ("get", "setdefault", "pop")

# Field names other JSON shapes of the code base use as well, so a string key alone does not say it is report data:
GENERIC = frozenset({
    # the spec and its TOML / editor-settings form, engine arguments, vLLM's compilation config
    "model", "target", "dtype", "spec", "engine_args", "args", "changes", "requests", "prompt", "prompt_token_ids",
    "custom_ops", "remote", "python", "version",
    # the tree's class index ({cls, file, line, forward_file, forward_line}), trace options, trace rows
    "file", "line", "forward_file", "forward_line", "positions", "rows",
    # the mapping agent: tool inputs ({target, reference, reason, checks}), Anthropic API bodies and usage, budgets,
    # its session records; the aligner sandbox's messages
    "reference", "reason", "input", "kind", "note", "usage", "input_tokens", "output_tokens", "calls", "dollars",
    "budget", "status", "schema",
    # error envelopes, worker and remote-host messages and summaries ({ok, why, error, message, missing, report,
    # modules, summary})
    "error", "message", "ok", "why", "missing", "report", "modules", "summary",
})

# (file, key) → why: a non-report dict whose key happens to be a distinctive contract field name.
ALLOWED = {
    ("ekka_core/agent/kb.py", "aligners"): "the knowledge base file's own list of validated aligners",
    ("ekka_core/agent/session.py", "checks"): "a mapping-agent tool input (an aligner proposal's self-checks)",
    ("ekka_core/agent/transcript.py", "explained"): "the agent transcript's validator records (JSONL)",
    ("ekka_core/agent/transcript.py", "from_knowledge_base"): "the agent transcript's session records (JSONL)",
    ("ekka_core/capture/run_process.py", "label"): "run.in.json, the target worker's own arguments",
}

DATA_NAME = re.compile(r"(^|_)(report|reports|scores|outputs)$")
DATA_FILES = ("report.json", "outputs.json", "reference-scores.json")
DATA_FILE_NAMES = frozenset({"OUTPUTS_FILE", "SCORES_FILE", "REPORT_FILE"})
# Calls whose result is their (first) argument's data, and methods whose result is their receiver's.
PASS_THROUGH = frozenset({"enumerate", "sorted", "list", "reversed", "dict", "tuple", "iter", "next", "zip"})
RECEIVER_DATA = frozenset({"items", "values", "copy"})


def contract_keys() -> frozenset[str]:
    keys = set()
    for name in CONTRACTS:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, dataclasses.is_dataclass):
            if cls.__module__ == name:
                keys.update(json_name(f) for f in dataclasses.fields(cls))
    return frozenset(keys)


def _string_key(node: ast.AST) -> str | None:
    """``"key"`` of ``x["key"]`` / ``x.get("key", …)`` / ``x.setdefault("key", …)`` / ``x.pop("key", …)``."""
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ACCESSORS \
            and node.args:
        key = node.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def _base(node: ast.AST) -> ast.AST:
    return node.value if isinstance(node, ast.Subscript) else node.func.value


class _Checker:
    def __init__(self, rel: str, keys: frozenset[str]):
        self.rel, self.keys = rel, keys
        self.tainted: set[str] = set()

    def distinctive(self, key: str | None) -> bool:
        return key in self.keys and key not in GENERIC and (self.rel, key) not in ALLOWED

    def is_data(self, node: ast.AST) -> bool:
        """Whether ``node`` evaluates to report / scores / outputs data (or a part of it)."""
        if isinstance(node, ast.Name):
            return node.id in self.tainted or bool(DATA_NAME.search(node.id))
        if isinstance(node, ast.Attribute):
            return bool(DATA_NAME.search(node.attr))
        if isinstance(node, ast.Subscript):
            return self.distinctive(_string_key(node)) or self.is_data(node.value)
        if isinstance(node, ast.BoolOp):
            return any(self.is_data(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self.is_data(node.body) or self.is_data(node.orelse)
        if isinstance(node, ast.Call):
            func = node.func
            if _string_key(node) is not None:
                return self.distinctive(_string_key(node)) or self.is_data(func.value)
            if isinstance(func, ast.Attribute) and func.attr in RECEIVER_DATA:
                return self.is_data(func.value)
            if isinstance(func, ast.Name) and func.id in PASS_THROUGH:
                return any(self.is_data(a) for a in node.args)
            if isinstance(func, ast.Attribute) and func.attr in ("loads", "load"):
                return _reads_a_data_file(node)
        return False

    def offends(self, node: ast.AST) -> bool:
        key = _string_key(node)
        if key is None or key not in self.keys or (self.rel, key) in ALLOWED:
            return False
        return key not in GENERIC or self.is_data(_base(node))

    def bind(self, scope: list[ast.AST]) -> None:
        """Taint every name the scope binds from data, to a fixed point."""
        while True:
            before = len(self.tainted)
            for root in scope:
                for node in ast.walk(root):
                    for targets, value in _bindings(node):
                        if self.is_data(value):
                            self.tainted.update(_names(targets))
            if len(self.tainted) == before:
                return


def _bindings(node: ast.AST):
    if isinstance(node, ast.Assign):
        yield node.targets, node.value
    elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        yield [node.target], node.value
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        yield [node.target], node.iter
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        yield [node.optional_vars], node.context_expr


def _names(targets: list[ast.AST]) -> set[str]:
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _reads_a_data_file(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(DATA_FILES):
            return True
        if isinstance(n, (ast.Name, ast.Attribute)) and (getattr(n, "id", None) or getattr(n, "attr", None)) \
                in DATA_FILE_NAMES:
            return True
    return False


def _scopes(tree: ast.Module) -> list[list[ast.AST]]:
    """The module's statements outside functions, then each outermost function (methods included, nested
    functions and lambdas inside it): a name bound from report data taints the rest of its function only."""
    functions: list[list[ast.AST]] = []
    top: list[ast.AST] = []

    def split(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append([stmt])
            elif isinstance(stmt, ast.ClassDef):
                split(stmt.body)
            else:
                top.append(stmt)

    split(tree.body)
    return [top, *functions]


def offenders(path: Path, keys: frozenset[str], rel: str | None = None) -> list[str]:
    """``file:line: expr`` for every string-key access to report / scores / outputs data in ``path``."""
    rel = rel or path.relative_to(REPO).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: dict[tuple[int, str], None] = {}
    for scope in _scopes(tree):
        checker = _Checker(rel, keys)
        checker.bind(scope)
        for root in scope:
            for node in ast.walk(root):
                if checker.offends(node):
                    found[(node.lineno, ast.unparse(node))] = None
    return [f"{rel}:{line}: {textwrap.shorten(expr, 110)}" for line, expr in sorted(found)]


def _sources() -> list[Path]:
    return [p for pkg in SOURCES for p in sorted((REPO / pkg).rglob("*.py"))
            if not any(p.is_relative_to(e) for e in EXEMPT)]


def test_report_scores_and_outputs_data_is_never_read_by_string_key():
    keys = contract_keys()
    assert {"verdict", "suspects", "own_prompt_token_ids", "low_rerouted", "num_cached_tokens"} <= keys
    problems = [line for path in _sources() for line in offenders(path, keys)]
    assert not problems, (
        f"{len(problems)} string-key accesses to report / scores / engine-outputs data (read the dataclass "
        f"field instead; a non-report dict that shares a key: add (file, key) to ALLOWED with the reason):\n"
        + "\n".join(problems))


def test_the_guard_finds_string_keys_on_report_data_and_spares_other_dicts(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(textwrap.dedent('''\
        import json

        def bad(report, served, path):
            top = report["suspects"][0]
            where = top["target"]["module"]
            data = json.loads((path / "report.json").read_text())
            for s in data.get("suspects", []):
                print(s["target"], s.get("file"))
            ids = served.scores["own_prompt_token_ids"]
            d = {}
            d.setdefault("verdict", "consistent")
            return where, ids, d.pop("onset_token", None)

        def fine(config, tool_input, classes, report):
            c = classes["Llama"]
            return (config["dtype"], config.get("model"), tool_input["target"], tool_input.get("reason"),
                    c.get("file"), c["line"], report.verdict, report.suspects[0].target.module)
        '''))
    found = [line.split(": ", 1)[1] for line in offenders(source, contract_keys(), rel="sample.py")]
    assert found == [
        "report['suspects']", "top['target']", "top['target']['module']", "data.get('suspects', [])",
        "s.get('file')", "s['target']", "served.scores['own_prompt_token_ids']",
        "d.setdefault('verdict', 'consistent')", "d.pop('onset_token', None)"], found
