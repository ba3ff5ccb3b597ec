"""Import a user's vLLM or SGLang reproduction script as a DiagnosisSpec — by reading it, never by running it.

``import_repro(path)`` parses the script with libcst, finds the engine constructor (``LLM(...)``,
``vllm.LLM(...)``, ``sgl.Engine(...)``) and the calls that generate with it (``llm.generate``, ``llm.chat``,
``engine.generate``), and evaluates the arguments that matter when they are literals or simple name bindings
(``PROMPTS = [...]``, ``MODEL = "org/name"``, ``"a" + "b"``, f-strings without substitutions, ``["x"] * 2``,
a ``for prompt in PROMPTS:`` loop). Anything whose value only exists when the script runs — an environment
variable, a command-line argument, a file, a list built in a loop — becomes an :class:`Unknown` with its line,
source snippet and a hint; the importer never guesses a value.

``to_toml(fields)`` writes a ``.ekka.toml`` that :meth:`DiagnosisSpec.from_toml` loads back, with the stdlib only.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider
from libcst.metadata.scope_provider import Assignment, ImportAssignment

from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.spec import DiagnosisSpec

__all__ = ["ReproImport", "Unknown", "import_repro", "to_toml"]

# Keys of DiagnosisSpec that to_toml writes, in this order (engine_args last: it is a table).
_SPEC_KEYS = ("model", "target", "reference", "dtype", "max_new_tokens", "threshold", "prompts", "engine_args")

_DTYPES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "half": "float16", "fp16": "float16",
    "float32": "float32", "float": "float32", "fp32": "float32",
}

# Engine constructor arguments that Ekka sets itself when it traces (capture/vllm_runner.engine_args).
_CONTROLLED = {
    "vllm": {
        "enforce_eager": "Ekka always traces with enforce_eager=True (module hooks do not fire under CUDA-graph "
                         "replay); if the bug only shows with CUDA graphs, the eager trace may not reproduce it",
        "compilation_config": "Ekka traces without torch.compile (compilation_config mode 0)",
        "enable_prefix_caching": "Ekka disables prefix caching (a cached prefix is never recomputed, so never traced)",
        "seed": "Ekka sets the seed itself and decodes greedily",
    },
    "sglang": {
        "disable_cuda_graph": "Ekka always traces without CUDA graphs (module hooks do not fire under replay)",
        "enable_torch_compile": "Ekka traces without torch.compile",
        "disable_radix_cache": "Ekka disables the radix (prefix) cache itself",
        "random_seed": "Ekka sets the seed itself and decodes greedily",
    },
}
_MODEL_KW = {"vllm": "model", "sglang": "model_path"}
_MAX_TOKENS_KW = {"vllm": "max_tokens", "sglang": "max_new_tokens"}
_DEFAULT_MAX_TOKENS = {"vllm": 16, "sglang": 128}
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "sort",
             "reverse", "add", "discard", "__setitem__"}
_MAX_REPEAT = 10_000


# ---------------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Unknown:
    """A construct the importer found but could not turn into a value. ``field`` names the spec field it
    feeds (``model``, ``prompts``, ``dtype``, ``max_new_tokens``, ``target``, ``engine_args.<name>``)."""

    field: str
    line: int
    snippet: str
    reason: str
    hint: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.reason}: `{self.snippet}` — {self.hint}"


@dataclass
class ReproImport:
    """What :func:`import_repro` found. ``fields`` holds only the DiagnosisSpec fields the script determines
    (``DiagnosisSpec(**fields)`` builds the spec when ``model`` and ``prompts`` are among them)."""

    path: Path
    fields: dict[str, Any]
    unknown: list[Unknown] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Conversations passed to ``llm.chat`` (one list of {"role", "content"} messages each), recorded verbatim:
    # Ekka takes raw prompt text, and which chat template renders them is decided only when the script runs.
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
    engine_line: int = 0

    @property
    def complete(self) -> bool:
        """True when every value the spec needs came out of the script (nothing left to fill in by hand)."""
        return not self.unknown and "model" in self.fields and bool(self.fields.get("prompts"))

    def spec(self) -> DiagnosisSpec:
        """The DiagnosisSpec (not validated). BadInput when the script did not determine model or prompts."""
        missing = [k for k in ("model", "prompts") if not self.fields.get(k)]
        if missing:
            details = "; ".join(str(u) for u in self.unknown if u.field in missing) or "not found in the script"
            raise BadInput(f"{self.path}: cannot determine {' and '.join(missing)} ({details})",
                           fix=f"write the spec with `ekka import-repro {self.path} --out SPEC.ekka.toml` "
                               "and fill in the missing values")
        return DiagnosisSpec(**self.fields)

    def to_toml(self) -> str:
        """The spec file: the fields found, plus commented placeholders for what must be filled in by hand."""
        fields = dict(self.fields)
        todo = {u.field.split(".", 1)[0] for u in self.unknown}
        comments = [f"Imported by `ekka import-repro` from {self.path} (the script was read, never run)."]
        comments += [f"note: {n}" for n in self.notes]
        comments += [f"UNKNOWN {u}" for u in self.unknown]
        for i, conv in enumerate(self.messages):
            comments.append(f"chat conversation {i + 1} (render it with the model's chat template into a prompt): "
                            + json.dumps(conv, ensure_ascii=False))
        # An empty prompts list keeps the file loadable and DiagnosisSpec.validate() names it. No placeholder
        # for model: from_toml would resolve "" to the spec file's own directory; without the key it says
        # "give at least `model` and `prompts`".
        fields.setdefault("prompts", [])
        return to_toml(fields, comments=comments, todo=todo)

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "fields": self.fields, "unknown": [asdict(u) for u in self.unknown],
                "notes": self.notes, "messages": self.messages, "engine_line": self.engine_line,
                "complete": self.complete}


# ---------------------------------------------------------------------------------------------------- TOML


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:  # lone surrogate: not representable in UTF-8 TOML
            raise ValueError(f"string {s!r} holds a lone surrogate and cannot be written as TOML")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(k: Any) -> str:
    if not isinstance(k, str):
        raise ValueError(f"TOML keys must be strings, not {k!r}")
    return k if _BARE_KEY.fullmatch(k) else _toml_str(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise ValueError(f"cannot write {v!r} ({type(v).__name__}) as TOML")


def _comment(text: str) -> list[str]:
    clean = "".join(ch if ch == "\t" or (ord(ch) >= 0x20 and ord(ch) != 0x7F) else " " for ch in text)
    return [f"# {clean}".rstrip()]


def to_toml(spec_fields: dict[str, Any], *, comments: Iterable[str] = (), todo: Iterable[str] = ()) -> str:
    """A ``.ekka.toml`` holding ``spec_fields`` (DiagnosisSpec field names; ``engine_args`` becomes a table).
    ``comments`` go at the top; each field named in ``todo`` gets a ``# TODO`` line above it."""
    unknown = set(spec_fields) - set(_SPEC_KEYS)
    if unknown:
        raise ValueError(f"not DiagnosisSpec fields: {', '.join(sorted(unknown))}")
    todo = set(todo) & set(_SPEC_KEYS)
    lines: list[str] = []
    for c in comments:
        for part in str(c).splitlines() or [""]:
            lines += _comment(part)
    if lines:
        lines.append("")
    for key in _SPEC_KEYS:
        if key == "engine_args":
            continue
        if key not in spec_fields:
            if key in todo:
                lines.append(f"# TODO {key}: see the UNKNOWN lines above")
            continue
        value = spec_fields[key]
        if value is None:
            raise ValueError(f"{key} is None; leave it out instead")
        if key in todo:
            lines.append(f"# TODO {key}: see the UNKNOWN lines above")
        if key == "prompts":
            if not isinstance(value, (list, tuple)):
                raise ValueError("prompts must be a list of strings")
            lines.append("prompts = [" + "".join(f"\n    {_toml_value(p)}," for p in value)
                         + ("\n]" if value else "]"))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    engine_args = spec_fields.get("engine_args")
    if engine_args or "engine_args" in todo:
        if not isinstance(engine_args or {}, dict):
            raise ValueError("engine_args must be a dict")
        lines.append("")
        if "engine_args" in todo:
            lines.append("# TODO engine_args: see the UNKNOWN lines above")
        lines.append("[engine_args]")
        for k, v in (engine_args or {}).items():
            if v is None:
                raise ValueError(f"engine_args.{k} is None; leave it out instead")
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- reading


class _Unresolved(Exception):
    def __init__(self, node: cst.CSTNode, reason: str, hint: str = ""):
        super().__init__(reason)
        self.node, self.reason, self.hint = node, reason, hint


@dataclass
class _Each:
    """A name bound by ``for NAME in ITER``: stands for each element of ITER in turn."""

    items: list[Any]
    loop: cst.For


@dataclass
class _Engine:
    kind: str
    call: cst.Call
    line: int
    receivers: set[str]  # source text of the names it is bound to ("llm", "self.llm")
    fields: dict[str, Any] = field(default_factory=dict)   # model, dtype, engine_args.<k>
    unknown: list[Unknown] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def import_repro(path: Path | str) -> ReproImport:
    """Read a vLLM or SGLang repro script (never executing it) and return the equivalent spec fields."""
    path = Path(path)
    try:
        source = path.read_bytes()
    except FileNotFoundError:
        raise BadInput(f"repro script {path} does not exist", fix="pass the path of an existing .py file") from None
    except OSError as e:
        raise BadInput(f"repro script {path} cannot be read ({e.strerror or e})",
                       fix="check the path and its permissions") from None
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        # CPython's parser (ast.parse compiles nothing and runs nothing) words syntax errors better than libcst.
        line, col, msg = e.editor_line, e.editor_column, str(e.message).strip().splitlines()[0]
        try:
            ast.parse(source, filename=str(path))
            msg = f"{msg} (Python itself accepts it: the syntax may be newer than libcst {_libcst_version()})"
        except SyntaxError as se:
            line, col, msg = se.lineno or line, se.offset or col, se.msg
        except ValueError:  # null bytes
            pass
        raise BadInput(f"{path}:{line}:{col}: syntax error: {msg}",
                       fix=f"fix line {line} of {path.name} so that Python can parse it "
                           "(Ekka reads the script, it never runs it)") from None
    except (UnicodeDecodeError, LookupError, SyntaxError) as e:
        raise BadInput(f"repro script {path} is not readable Python source ({e})",
                       fix="save it as UTF-8 text") from None
    return _Importer(path, module).run()


class _Importer:
    def __init__(self, path: Path, module: cst.Module):
        self.path = path
        self.wrapper = MetadataWrapper(module)
        self.module = self.wrapper.module
        self.pos = self.wrapper.resolve(PositionProvider)
        self.parents = self.wrapper.resolve(ParentNodeProvider)
        self.scopes = self.wrapper.resolve(ScopeProvider)
        self.calls: list[cst.Call] = [n for n in self.pos if isinstance(n, cst.Call)]
        self.calls.sort(key=lambda n: (self.pos[n].start.line, self.pos[n].start.column))
        self._aliases()
        self.unknown: list[Unknown] = []
        self.notes: list[str] = []
        self.messages: list[list[dict[str, Any]]] = []

    # ------------------------------------------------------------------ helpers

    def line(self, node: cst.CSTNode) -> int:
        return self.pos[node].start.line

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def snippet(self, node: cst.CSTNode, limit: int = 100) -> str:
        text = " ".join(self.code(node).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def add_unknown(self, fld: str, err: _Unresolved, hint: str) -> None:
        full_hint = f"{err.hint}; {hint}" if err.hint else hint
        u = Unknown(fld, self.line(err.node), self.snippet(err.node), err.reason, full_hint)
        if u not in self.unknown:
            self.unknown.append(u)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _aliases(self) -> None:
        """Which names are vLLM's LLM / SamplingParams, SGLang's Engine, and the vllm / sglang modules."""
        self.names: dict[str, str] = {}          # local name -> "vllm.LLM" | "vllm.SamplingParams" | "sglang.Engine"
        self.modules: dict[str, str] = {}        # local name -> "vllm" | "sglang" | "os" | "torch" ...
        for node in self.pos:
            if isinstance(node, cst.Import):
                for alias in node.names:
                    full = self.code(alias.name)
                    local = self.code(alias.asname.name) if alias.asname else full
                    self.modules[local] = full.split(".")[0] if not alias.asname else full
            elif isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative:
                mod = self.code(node.module)
                top = mod.split(".")[0]
                if isinstance(node.names, cst.ImportStar):
                    if top == "vllm":
                        self.names.setdefault("LLM", "vllm.LLM")
                        self.names.setdefault("SamplingParams", "vllm.SamplingParams")
                    elif top == "sglang":
                        self.names.setdefault("Engine", "sglang.Engine")
                    continue
                for alias in node.names:
                    name = self.code(alias.name)
                    local = self.code(alias.asname.name) if alias.asname else name
                    if top in ("vllm", "sglang"):
                        self.names[local] = f"{top}.{name}"
                    else:
                        self.modules.setdefault(local, f"{mod}.{name}")

    def qualname(self, func: cst.BaseExpression) -> str | None:
        """``vllm.LLM`` / ``vllm.SamplingParams`` / ``sglang.Engine`` for the callee, else None."""
        if isinstance(func, cst.Name):
            if func.value in self.names:
                return self.names[func.value]
            if func.value in ("LLM", "SamplingParams"):  # snippets pasted without their import line
                return f"vllm.{func.value}"
            return None
        if isinstance(func, cst.Attribute):
            base = self.code(func.value)
            top = base.split(".")[0]
            mod = self.modules.get(top, top)
            mod = mod.split(".")[0]
            if mod in ("vllm", "sglang") or top in ("sgl",):
                return f"{'sglang' if top == 'sgl' else mod}.{func.attr.value}"
        return None

    # ------------------------------------------------------------------ name bindings

    def binding(self, name: cst.Name) -> cst.BaseExpression | _Each:
        """The expression a name is bound to (single assignment, never mutated), or _Each for a loop variable."""
        scope = self.scopes.get(name)
        if scope is None:
            raise _Unresolved(name, f"`{name.value}` is not a name the script binds")
        assignments = [a for a in scope[name.value]]
        if not assignments:
            raise _Unresolved(name, f"`{name.value}` is never assigned in the script",
                              "it is probably defined elsewhere")
        if len(assignments) > 1:
            lines = sorted({self.line(a.node) for a in assignments if isinstance(a, Assignment)})
            raise _Unresolved(name, f"`{name.value}` is assigned {len(assignments)} times"
                              + (f" (lines {', '.join(map(str, lines))})" if lines else ""),
                              "which value is used depends on how the script runs")
        a = assignments[0]
        if isinstance(a, ImportAssignment):
            raise _Unresolved(name, f"`{name.value}` is imported ({self.snippet(a.node)})",
                              "its value lives in another module")
        if not isinstance(a, Assignment):
            raise _Unresolved(name, f"`{name.value}` is a Python builtin")
        for ref in a.references:
            self._check_mutation(name.value, ref.node)
        target = a.node
        parent = self.parents.get(target)
        if isinstance(parent, cst.AssignTarget):
            return self.parents[parent].value  # type: ignore[union-attr]
        if isinstance(parent, cst.AnnAssign) and parent.target is target and parent.value is not None:
            return parent.value
        if isinstance(parent, cst.For) and parent.target is target:
            return _Each(self._iterable(parent.iter), parent)
        if isinstance(parent, cst.Element):
            tup = self.parents.get(parent)
            loop = self.parents.get(tup) if tup is not None else None
            if (isinstance(tup, cst.Tuple) and isinstance(loop, cst.For) and loop.target is tup
                    and len(tup.elements) == 2 and tup.elements[1] is parent and isinstance(loop.iter, cst.Call)
                    and isinstance(loop.iter.func, cst.Name) and loop.iter.func.value == "enumerate"
                    and len(loop.iter.args) == 1):
                return _Each(self._iterable(loop.iter.args[0].value), loop)
        if isinstance(target, cst.Param) or isinstance(parent, cst.Param):
            raise _Unresolved(target, f"`{name.value}` is a function parameter",
                              "its value depends on how the function is called")
        stmt = parent
        while stmt is not None and not isinstance(stmt, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            stmt = self.parents.get(stmt)
        where = self.snippet(stmt, 60) if stmt is not None else name.value
        raise _Unresolved(target, f"`{name.value}` is bound at run time by `{where}`")

    def _check_mutation(self, name: str, ref: cst.CSTNode) -> None:
        parent = self.parents.get(ref)
        if isinstance(parent, cst.Attribute) and parent.value is ref and parent.attr.value in _MUTATORS:
            call = self.parents.get(parent)
            raise _Unresolved(call if isinstance(call, cst.Call) else parent,
                              f"`{name}` is modified with .{parent.attr.value}(...)",
                              "its contents are only known when the script runs")
        if isinstance(parent, cst.Subscript) and parent.value is ref:
            holder = self.parents.get(parent)
            if isinstance(holder, (cst.AssignTarget, cst.Del)) or (isinstance(holder, cst.AugAssign)
                                                                   and holder.target is parent):
                if isinstance(holder, cst.AssignTarget):
                    holder = self.parents[holder]
                raise _Unresolved(holder, f"`{name}` is modified by item assignment",
                                  "its contents are only known when the script runs")

    def deref(self, node: cst.BaseExpression, depth: int = 0) -> cst.BaseExpression | _Each:
        """Follow name bindings to the expression they stand for."""
        while isinstance(node, cst.Name) and node.value not in ("True", "False", "None"):
            if depth > 50:
                raise _Unresolved(node, f"`{node.value}` refers to itself")
            bound = self.binding(node)
            if isinstance(bound, _Each):
                return bound
            node, depth = bound, depth + 1
        return node

    def _iterable(self, node: cst.BaseExpression) -> list[Any]:
        value = self.value(node)
        if isinstance(value, str):
            raise _Unresolved(node, "the loop iterates over the characters of a string")
        if not isinstance(value, list):
            raise _Unresolved(node, "the loop does not iterate over a list")
        return value

    # ------------------------------------------------------------------ literal evaluation

    def value(self, node: cst.BaseExpression, depth: int = 0) -> Any:
        """The Python value of a literal expression (following name bindings), or _Unresolved."""
        if depth > 100:
            raise _Unresolved(node, "expression is too deeply nested")
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            return self._string(node)
        if isinstance(node, (cst.Integer, cst.Float)):
            return ast.literal_eval(node.value)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            v = self.value(node.expression, depth + 1)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return -v if isinstance(node.operator, cst.Minus) else v
            raise _Unresolved(node, "unary operator on a non-number")
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.value]
            bound = self.deref(node)
            if isinstance(bound, _Each):
                raise _Unresolved(node, f"`{node.value}` is a loop variable (line {self.line(bound.loop)})",
                                  "it takes several values while the script runs")
            return self.value(bound, depth + 1)
        if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
            out: list[Any] = []
            for el in node.elements:
                if isinstance(el, cst.StarredElement):
                    inner = self.value(el.value, depth + 1)
                    if not isinstance(inner, list):
                        raise _Unresolved(el, "starred element is not a list")
                    out.extend(inner)
                else:
                    out.append(self.value(el.value, depth + 1))
            return out
        if isinstance(node, cst.Dict):
            d: dict[Any, Any] = {}
            for el in node.elements:
                if isinstance(el, cst.StarredDictElement):
                    inner = self.value(el.value, depth + 1)
                    if not isinstance(inner, dict):
                        raise _Unresolved(el, "`**` of something that is not a dict")
                    d.update(inner)
                else:
                    key = self.value(el.key, depth + 1)
                    if not isinstance(key, (str, int, float, bool)):
                        raise _Unresolved(el.key, "dict key is not a string or number")
                    d[key] = self.value(el.value, depth + 1)
            return d
        if isinstance(node, cst.BinaryOperation):
            return self._binop(node, depth)
        if isinstance(node, cst.Subscript):
            return self._subscript(node, depth)
        if isinstance(node, cst.Call):
            return self._call(node, depth)
        if isinstance(node, cst.Attribute):
            raise self._runtime(node)
        if isinstance(node, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            raise _Unresolved(node, "built by a comprehension when the script runs",
                              "write the resulting values out literally")
        if isinstance(node, cst.IfExp):
            raise _Unresolved(node, "a conditional expression", "the branch taken is decided at run time")
        if isinstance(node, cst.Await):
            raise _Unresolved(node, "the result of an `await`")
        raise _Unresolved(node, f"not a literal ({type(node).__name__})")

    def _string(self, node: cst.BaseExpression) -> str:
        for sub in _string_parts(node):
            if isinstance(sub, cst.FormattedString) and any(
                    isinstance(p, cst.FormattedStringExpression) for p in sub.parts):
                raise _Unresolved(node, "an f-string with substitutions", "its text is computed at run time")
        try:
            tree = ast.parse("(" + self.code(node) + ")", mode="eval").body
        except SyntaxError:  # pragma: no cover - libcst parsed it already
            raise _Unresolved(node, "a string literal Ekka cannot read") from None
        text = _ast_string(tree)
        if text is None:
            raise _Unresolved(node, "bytes, not text")
        return text

    def _binop(self, node: cst.BinaryOperation, depth: int) -> Any:
        left = self.value(node.left, depth + 1)
        right = self.value(node.right, depth + 1)
        if isinstance(node.operator, cst.Add):
            if (isinstance(left, str) and isinstance(right, str)) or (isinstance(left, list)
                                                                      and isinstance(right, list)):
                return left + right
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
                return left + right
        if isinstance(node.operator, cst.Multiply):
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list)) and isinstance(n, int) and not isinstance(n, bool):
                if n * max(len(seq), 1) > _MAX_REPEAT * 100 or n > _MAX_REPEAT:
                    raise _Unresolved(node, f"repeats {n} times, too many to write into a spec")
                return seq * n
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
                return left * right
        if isinstance(node.operator, cst.Modulo) and isinstance(left, str):
            raise _Unresolved(node, "a %-formatted string", "its text is computed at run time")
        raise _Unresolved(node, "an operation Ekka does not evaluate", "write the value out literally")

    def _subscript(self, node: cst.Subscript, depth: int) -> Any:
        base_code = self.code(node.value)
        if base_code.endswith("environ"):
            raise self._runtime(node)
        if base_code.endswith("argv"):
            raise _Unresolved(node, "a command-line argument (sys.argv)",
                              "its value is given when the script is started")
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            raise _Unresolved(node, "a slice Ekka does not evaluate")
        base = self.value(node.value, depth + 1)
        idx = self.value(node.slice[0].slice.value, depth + 1)
        try:
            return base[idx]
        except (KeyError, IndexError, TypeError):
            raise _Unresolved(node, f"index {idx!r} is not in the value") from None

    def _call(self, node: cst.Call, depth: int) -> Any:
        func = node.func
        if isinstance(func, cst.Name) and func.value == "dict" and all(
                a.keyword is not None or a.star == "**" for a in node.args):
            d: dict[str, Any] = {}
            for a in node.args:
                if a.star == "**":
                    inner = self.value(a.value, depth + 1)
                    if not isinstance(inner, dict):
                        raise _Unresolved(a, "`**` of something that is not a dict")
                    d.update(inner)
                else:
                    d[a.keyword.value] = self.value(a.value, depth + 1)  # type: ignore[union-attr]
            return d
        if isinstance(func, cst.Name) and func.value in ("list", "tuple") and len(node.args) == 1 \
                and not node.args[0].star and node.args[0].keyword is None:
            inner = self.value(node.args[0].value, depth + 1)
            if isinstance(inner, list):
                return list(inner)
        if (isinstance(func, cst.Attribute) and func.attr.value == "join" and len(node.args) == 1
                and isinstance(func.value, (cst.SimpleString, cst.ConcatenatedString, cst.Name))):
            sep = self.value(func.value, depth + 1)
            items = self.value(node.args[0].value, depth + 1)
            if isinstance(sep, str) and isinstance(items, list) and all(isinstance(i, str) for i in items):
                return sep.join(items)
        raise self._runtime(node)

    def _runtime(self, node: cst.BaseExpression) -> _Unresolved:
        """Why a call / attribute has no value before the script runs, with a hint about where it comes from."""
        text = self.code(node)
        env = re.search(r"""(?:environ\s*\[|environ\.get\s*\(|getenv\s*\()\s*(['"])([^'"]+)\1""", text)
        if env or re.search(r"\b(environ|getenv)\b", text):
            var = env.group(2) if env else "?"
            default = self._env_default(node)
            return _Unresolved(node, f"read from environment variable {var}",
                               f"the script's default is {default!r}" if default is not None
                               else "its value is only known when the script runs")
        if isinstance(node, cst.Attribute):
            hint = self._argparse_hint(node)
            if hint:
                return _Unresolved(node, "a command-line argument", hint)
            return _Unresolved(node, f"attribute `{text}` has a value only at run time")
        if re.search(r"\b(open|read_text|read|readlines|load|loads|load_dataset|read_csv|read_json)\s*\(", text):
            return _Unresolved(node, "read from a file or data set when the script runs",
                               "paste the text it reads")
        if re.search(r"\binput\s*\(", text):
            return _Unresolved(node, "typed in when the script runs")
        if re.search(r"\bparse_args\s*\(", text):
            return _Unresolved(node, "command-line arguments")
        callee = self.code(node.func) if isinstance(node, cst.Call) else text
        return _Unresolved(node, f"the result of calling `{' '.join(callee.split())}(...)` at run time")

    def _env_default(self, node: cst.BaseExpression) -> Any:
        if isinstance(node, cst.Call) and len(node.args) >= 2 and re.search(r"(environ\.get|getenv)$",
                                                                            self.code(node.func)):
            try:
                return self.value(node.args[1].value)
            except _Unresolved:
                return None
        return None

    def _argparse_hint(self, node: cst.Attribute) -> str | None:
        attr = node.attr.value
        for call in self.calls:
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
                continue
            flags, dest, default, has_default = [], None, None, False
            for a in call.args:
                if a.keyword is None:
                    try:
                        flags.append(self.value(a.value))
                    except _Unresolved:
                        pass
                elif a.keyword.value == "dest":
                    try:
                        dest = self.value(a.value)
                    except _Unresolved:
                        pass
                elif a.keyword.value == "default":
                    try:
                        default, has_default = self.value(a.value), True
                    except _Unresolved:
                        pass
            names = [f.lstrip("-").replace("-", "_") for f in flags if isinstance(f, str)]
            if dest == attr or (dest is None and attr in names):
                flag = next((f for f in flags if isinstance(f, str) and f.startswith("--")), flags[0] if flags
                            else attr)
                return (f"it comes from the command line ({flag}, line {self.line(call)}"
                        + (f", default {default!r} in the script)" if has_default else ")"))
        return None

    # ------------------------------------------------------------------ the engine

    def engines(self) -> list[_Engine]:
        found: list[_Engine] = []
        for call in self.calls:
            q = self.qualname(call.func)
            if q not in ("vllm.LLM", "sglang.Engine"):
                continue
            receivers: set[str] = set()
            parent = self.parents.get(call)
            if isinstance(parent, cst.Assign):
                receivers = {" ".join(self.code(t.target).split()) for t in parent.targets}
            elif isinstance(parent, (cst.AnnAssign, cst.NamedExpr)):
                receivers = {self.code(parent.target)}
            elif isinstance(parent, cst.WithItem) and parent.asname is not None:
                receivers = {self.code(parent.asname.name)}
            found.append(_Engine(q.split(".")[0], call, self.line(call), receivers))
        return found

    def read_engine(self, eng: _Engine) -> None:
        kind, call = eng.kind, eng.call
        model_kw = _MODEL_KW[kind]
        # (keyword, expression or already-evaluated value, node to point at, whether it is evaluated)
        args: list[tuple[str, Any, cst.CSTNode, bool]] = []
        for i, a in enumerate(call.args):
            if a.star == "**":
                try:
                    splat = self.value(a.value)
                    if not isinstance(splat, dict):
                        raise _Unresolved(a, "`**` of something that is not a dict")
                except _Unresolved as e:
                    eng.unknown.append(self._unknown("engine_args", e, "write the engine arguments out as "
                                                     "keyword arguments or fill in [engine_args]"))
                    continue
                for k, v in splat.items():
                    args.append((str(k), v, a, True))
            elif a.star == "*":
                eng.unknown.append(self._unknown("engine_args", _Unresolved(a, "`*` arguments"),
                                                 "write the engine arguments out as keyword arguments"))
            elif a.keyword is None:
                if i == 0:
                    args.append((model_kw, a.value, a, False))
                else:
                    eng.unknown.append(self._unknown("engine_args", _Unresolved(
                        a, f"positional argument {i + 1} of the engine"), "pass it as a keyword argument"))
            else:
                args.append((a.keyword.value, a.value, a, False))
        for kw, expr, node, evaluated in args:
            try:
                value = expr if evaluated else self.value(expr)
            except _Unresolved as e:
                fld = "model" if kw == model_kw else "dtype" if kw == "dtype" else f"engine_args.{kw}"
                if kw == "dtype":
                    dt = self._torch_dtype(expr)
                    if dt is not None:
                        eng.fields["dtype"] = dt
                        continue
                what = {"model": "set `model` to the checkpoint directory or HF model id the script loads",
                        "dtype": "set `dtype` to bfloat16, float16 or float32"}.get(
                    fld, f"set `{kw}` under [engine_args] to the value the script uses, or leave it out")
                eng.unknown.append(self._unknown(fld, e, what))
                continue
            if kw == model_kw:
                if not isinstance(value, str) or not value or _toml_problem(value):
                    eng.unknown.append(self._unknown("model", _Unresolved(node, "model is not a string"),
                                                     "set `model` to a checkpoint directory or HF id"))
                else:
                    eng.fields["model"] = value
            elif kw == "dtype":
                self._dtype(eng, value, node)
            elif kw in _CONTROLLED[kind]:
                eng.notes.append(f"{kw}={value!r} (line {self.line(node)}) is not copied: {_CONTROLLED[kind][kw]}")
            elif value is None:
                eng.notes.append(f"{kw}=None (line {self.line(node)}) left out: None is the engine's default")
            else:
                problem = _toml_problem(value)
                if problem:
                    eng.unknown.append(self._unknown(f"engine_args.{kw}", _Unresolved(node, problem),
                                                     f"set `{kw}` under [engine_args] by hand"))
                else:
                    eng.fields[f"engine_args.{kw}"] = value
        if "dtype" not in eng.fields and not any(u.field == "dtype" for u in eng.unknown):
            eng.fields["dtype"] = "auto"  # what the engine does when the script does not say
        if "model" not in eng.fields and not any(u.field == "model" for u in eng.unknown):
            eng.unknown.append(self._unknown("model", _Unresolved(call, f"the engine is built without `{model_kw}`"),
                                             "set `model` to the checkpoint directory or HF id"))

    def _torch_dtype(self, expr: cst.BaseExpression) -> str | None:
        try:
            node = self.deref(expr)
        except _Unresolved:
            return None
        if isinstance(node, cst.Attribute) and self.modules.get(self.code(node.value), self.code(node.value)) \
                == "torch" and node.attr.value in _DTYPES:
            return _DTYPES[node.attr.value]
        return None

    def _dtype(self, eng: _Engine, value: Any, node: cst.CSTNode) -> None:
        if isinstance(value, str) and value.lower() in _DTYPES:
            eng.fields["dtype"] = _DTYPES[value.lower()]
        elif value is None or (isinstance(value, str) and value.lower() == "auto"):
            eng.fields["dtype"] = "auto"
        else:
            eng.unknown.append(self._unknown("dtype", _Unresolved(node, f"dtype {value!r} is not one Ekka traces"),
                                             "use bfloat16, float16 or float32"))

    def _unknown(self, fld: str, err: _Unresolved, hint: str) -> Unknown:
        full_hint = f"{err.hint}; {hint}" if err.hint else hint
        return Unknown(fld, self.line(err.node), self.snippet(err.node), err.reason, full_hint)

    # ------------------------------------------------------------------ generation calls

    def generation_calls(self, engines: list[_Engine]) -> tuple[list[tuple[_Engine, cst.Call, str]], list[cst.Call]]:
        by_call = {id(e.call): e for e in engines}
        by_receiver = {r: e for e in engines for r in e.receivers}
        matched, candidates = [], []
        for call in self.calls:
            func = call.func
            if not isinstance(func, cst.Attribute):
                continue
            method = func.attr.value
            if method not in ("generate", "chat", "async_generate", "beam_search"):
                continue
            recv = func.value
            if isinstance(recv, cst.NamedExpr):  # (llm := LLM(...)).generate(...)
                recv = recv.value
            eng = by_call.get(id(recv)) or by_receiver.get(" ".join(self.code(recv).split()))
            if eng is None and isinstance(recv, cst.Name):
                try:
                    bound = self.deref(recv)
                    eng = by_call.get(id(bound))
                except _Unresolved:
                    pass
            if eng is None:
                candidates.append(call)
                continue
            if method == "chat" and eng.kind != "vllm":
                candidates.append(call)
                continue
            matched.append((eng, call, method))
        return matched, candidates

    def read_generation(self, eng: _Engine, call: cst.Call, method: str,
                        prompts: list[list[str]], sampling: list[tuple[cst.CSTNode, dict[str, Any]]]) -> None:
        kind = eng.kind
        positional = [a for a in call.args if a.keyword is None and not a.star]
        kwargs = {a.keyword.value: a for a in call.args if a.keyword is not None}
        if any(a.star for a in call.args):
            self.add_unknown("prompts", _Unresolved(call, "arguments passed with * or **"),
                             "pass the prompts and sampling parameters explicitly")
        if method == "beam_search":
            self.add_unknown("prompts", _Unresolved(call, "beam search"),
                             "Ekka diagnoses greedy decoding; use llm.generate with the same prompts")
            return
        first_kw = {"vllm": "messages" if method == "chat" else "prompts", "sglang": "prompt"}[kind]
        prompt_arg = kwargs[first_kw].value if first_kw in kwargs else positional[0].value if positional else None
        sp_arg = (kwargs["sampling_params"].value if "sampling_params" in kwargs
                  else positional[1].value if len(positional) > 1 else None)
        for bad, why in (("prompt_token_ids", "token ids instead of text"), ("input_ids", "token ids instead of text"),
                         ("lora_request", "a LoRA adapter"), ("image_data", "multimodal input"),
                         ("multi_modal_data", "multimodal input")):
            if bad in kwargs:
                self.add_unknown("prompts", _Unresolved(kwargs[bad], f"the call passes {why}"),
                                 "Ekka diagnoses text prompts on the base model; give the prompt text")
        if method == "chat":
            self._chat(call, prompt_arg, kwargs)
        elif prompt_arg is None:
            if not any(k in kwargs for k in ("prompt_token_ids", "input_ids")):
                self.add_unknown("prompts", _Unresolved(call, "the call passes no prompt"), "add the prompt text")
        else:
            batch = self._prompts(prompt_arg)
            if batch and batch not in prompts:  # the same batch generated twice (warm-up, timing) counts once
                prompts.append(batch)
        self._sampling(kind, call, sp_arg, sampling)

    def _prompts(self, arg: cst.BaseExpression) -> list[str]:
        """The prompt texts one generate call passes, in order (duplicates kept: they are part of the batch)."""
        hint = "put the prompt text in `prompts`"
        prompts: list[str] = []
        try:
            bound = self.deref(arg)
            if isinstance(bound, _Each):
                items = [p for item in bound.items for p in (item if isinstance(item, list) else [item])]
                self.note(f"the script generates one prompt at a time in a loop (line {self.line(bound.loop)}); "
                          "Ekka runs all the prompts as one batch")
            else:
                value = self.value(bound)
                items = value if isinstance(value, list) else [value]
        except _Unresolved as e:
            self.add_unknown("prompts", e, hint)
            return []
        for item in items:
            if isinstance(item, dict):
                extra = sorted(set(item) - {"prompt"})
                if "prompt" not in item or not isinstance(item["prompt"], str) or extra:
                    self.add_unknown("prompts", _Unresolved(arg, "a prompt dict with "
                                                            + (", ".join(extra) or "no text `prompt`")),
                                     "Ekka diagnoses text prompts; give the prompt text")
                    continue
                item = item["prompt"]
            if not isinstance(item, str) or _toml_problem(item):
                why = _toml_problem(item) if isinstance(item, str) else f"not text ({type(item).__name__})"
                self.add_unknown("prompts", _Unresolved(arg, f"a prompt that is {why}"), hint)
                continue
            prompts.append(item)
        return prompts

    def _chat(self, call: cst.Call, arg: cst.BaseExpression | None, kwargs: dict[str, cst.Arg]) -> None:
        hint = ("llm.chat renders the messages with the model's chat template: render them "
                "(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)) "
                "and put the resulting text in `prompts`")
        if arg is None:
            self.add_unknown("prompts", _Unresolved(call, "llm.chat without messages"), hint)
            return
        try:
            value = self.value(arg)
        except _Unresolved as e:
            self.add_unknown("prompts", e, hint)
            return
        convs = value if value and all(isinstance(c, list) for c in value) else [value]
        for conv in convs:
            if not (isinstance(conv, list) and conv and all(isinstance(m, dict) and "role" in m for m in conv)):
                self.add_unknown("prompts", _Unresolved(arg, "messages are not a list of {role, content} dicts"),
                                 hint)
                return
            if conv not in self.messages:
                self.messages.append(conv)
        if "chat_template" in kwargs:
            self.note(f"llm.chat at line {self.line(call)} uses a custom chat_template")
        self.note(f"llm.chat at line {self.line(call)}: chat templating is involved; the messages are recorded "
                  "and must be rendered into prompt text")
        self.add_unknown("prompts", _Unresolved(call, "chat messages, not prompt text"), hint)

    def _sampling(self, kind: str, call: cst.Call, arg: cst.BaseExpression | None,
                  sampling: list[tuple[cst.CSTNode, dict[str, Any]]]) -> None:
        if arg is None:
            sampling.append((call, {}))
            return
        try:
            node = self.deref(arg)
            if isinstance(node, _Each):
                raise _Unresolved(arg, "sampling parameters from a loop variable")
            if kind == "vllm":
                items = self._sampling_params_list(node)
            else:
                value = self.value(node)
                items = value if isinstance(value, list) else [value]
                if not all(isinstance(i, dict) for i in items):
                    raise _Unresolved(arg, "sampling_params is not a dict")
        except _Unresolved as e:
            self.add_unknown("max_new_tokens", e, "set `max_new_tokens` to the script's "
                             f"{_MAX_TOKENS_KW[kind]}")
            return
        key = _MAX_TOKENS_KW[kind]
        for params in items:
            params = dict(params)
            if key in params:  # one spelling for both engines: "max_new_tokens"
                params["max_new_tokens"] = params.pop(key)
            elif key != "max_new_tokens":
                params.pop("max_new_tokens", None)
            sampling.append((arg, params))

    def _sampling_params_list(self, node: cst.BaseExpression) -> list[dict[str, Any]]:
        if isinstance(node, (cst.List, cst.Tuple)):
            return [p for el in node.elements for p in self._sampling_params_list(self._deref_plain(el.value))]
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            return self._sampling_params_list(self._deref_plain(node.left))
        if isinstance(node, cst.Call) and self.qualname(node.func) == "vllm.SamplingParams":
            params: dict[str, Any] = {}
            for a in node.args:
                if a.keyword is None:
                    raise _Unresolved(a, "positional SamplingParams argument")
                try:
                    params[a.keyword.value] = self.value(a.value)
                except _Unresolved as e:
                    if a.keyword.value == "max_tokens":
                        raise
                    params[a.keyword.value] = _Opaque(self.snippet(e.node))
            return [params]
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            items = self._sampling_params_list(self._deref_plain(node.value))
            idx = self.value(node.slice[0].slice.value)
            if isinstance(idx, int) and not isinstance(idx, bool) and -len(items) <= idx < len(items):
                return [items[idx]]
        if isinstance(node, cst.Name) and node.value == "None":
            return [{}]
        raise _Unresolved(node, "not a SamplingParams(...) call")

    def _deref_plain(self, node: cst.BaseExpression) -> cst.BaseExpression:
        bound = self.deref(node)
        if isinstance(bound, _Each):
            raise _Unresolved(node, "sampling parameters from a loop variable")
        return bound

    def merge_sampling(self, kind: str, sampling: list[tuple[cst.CSTNode, dict[str, Any]]],
                       fields: dict[str, Any]) -> None:
        if not sampling:
            return
        key, canon = _MAX_TOKENS_KW[kind], "max_new_tokens"
        values = {json.dumps(p.get(canon), sort_keys=True, default=str) for _, p in sampling}
        if len(values) > 1:
            node = sampling[0][0]
            shown = ", ".join(f"line {self.line(n)}: {_show(p[canon]) if canon in p else 'not set'}"
                              for n, p in sampling)
            self.unknown.append(Unknown("max_new_tokens", self.line(node), self.snippet(node),
                                        f"the generation calls use different {key} ({shown})",
                                        "Ekka runs one setting; set `max_new_tokens` to the one that shows the bug"))
        else:
            mt = sampling[0][1].get(canon)
            if mt is None:
                self.note(f"the script does not set {key} (the engine's default is {_DEFAULT_MAX_TOKENS[kind]}); "
                          "the spec keeps Ekka's default max_new_tokens")
            elif isinstance(mt, int) and not isinstance(mt, bool) and 1 <= mt <= 4096:
                fields["max_new_tokens"] = mt
            else:
                node = sampling[0][0]
                self.unknown.append(Unknown("max_new_tokens", self.line(node), self.snippet(node),
                                            f"{key}={mt!r} is outside Ekka's range 1..4096",
                                            "a numerical divergence shows within the first tokens: use e.g. 32"))
        temps = {_show(p["temperature"]) if "temperature" in p else "unset (the engine's default, usually 1.0)"
                 for _, p in sampling}
        if not temps <= {"0", "0.0"}:
            shown = ", ".join(sorted(temps))
            self.note(f"the script samples with temperature {shown}; Ekka diagnoses with greedy decoding "
                      "(temperature 0)")
        ignored = sorted({f"{k}={_show(v)}" for _, p in sampling for k, v in p.items()
                          if k not in (canon, "temperature", "stream")})
        if ignored:
            self.note(f"sampling parameters not used by Ekka (it decodes greedily): {', '.join(ignored)}")

    # ------------------------------------------------------------------ putting it together

    def run(self) -> ReproImport:
        engines = self.engines()
        if not engines:
            raise BadInput(f"{self.path} has no LLM(...) or Engine(...) call",
                           fix="Ekka imports scripts that build a vLLM `LLM(model=...)` or an SGLang "
                               "`sgl.Engine(model_path=...)`; write a spec file or pass --model and --prompt")
        for eng in engines:
            self.read_engine(eng)
        fields: dict[str, Any] = {"reference": "hf"}
        kinds = sorted({e.kind for e in engines})
        if len(kinds) == 1:
            fields["target"] = kinds[0]
        else:
            first = engines[0]
            self.unknown.append(Unknown("target", first.line, self.snippet(first.call),
                                        "the script builds both vLLM and SGLang engines",
                                        "set `target` to the engine that shows the bug"))
        self._merge_engines(engines, fields)

        matched, candidates = self.generation_calls(engines)
        batches: list[list[str]] = []
        sampling: list[tuple[cst.CSTNode, dict[str, Any]]] = []
        for eng, call, method in matched:
            self.read_generation(eng, call, method, batches, sampling)
        if batches:
            fields["prompts"] = [p for b in batches for p in b]
        if len(batches) > 1:
            self.note(f"the prompts come from {len(batches)} generation calls; Ekka runs them all as one batch")
        if not matched:
            shown = "; ".join(f"line {self.line(c)}: {self.snippet(c, 60)}" for c in candidates[:5])
            self.unknown.append(Unknown(
                "prompts", engines[0].line, self.snippet(engines[0].call),
                "no generate(...) call on this engine was found",
                "put the prompt text in `prompts`" + (f" (calls that might use the engine: {shown})"
                                                       if shown else "")))
        self.merge_sampling(fields.get("target", kinds[0]), sampling, fields)

        if fields.get("dtype") == "auto":
            del fields["dtype"]
            resolved = _checkpoint_dtype(fields.get("model"), self.path)
            what = "dtype='auto' (set so, or not set) makes the engine use the checkpoint's own dtype"
            if resolved:
                fields["dtype"] = resolved
                self.note(f"{what}: {resolved} (from its config.json)")
            else:
                self.note(f"{what}; the spec keeps Ekka's default (bfloat16) — set `dtype` if the checkpoint "
                          "is float16 or float32")
        model = fields.get("model")
        if isinstance(model, str) and model.startswith((".", "~")):
            self.note(f"model path {model!r} is relative to the directory the script was run from; "
                      "the spec resolves a relative model against the spec file's directory")
        self.unknown.sort(key=lambda u: (u.line, u.field))
        return ReproImport(self.path, {k: fields[k] for k in _SPEC_KEYS if k in fields}, self.unknown,
                           self.notes, self.messages, engines[0].line)

    def _merge_engines(self, engines: list[_Engine], fields: dict[str, Any]) -> None:
        for eng in engines:
            for u in eng.unknown:
                if u not in self.unknown:
                    self.unknown.append(u)
            for n in eng.notes:
                self.note(n)
        keys: list[str] = []
        for eng in engines:
            keys += [k for k in eng.fields if k not in keys]
        unknown_fields = {u.field for u in self.unknown}
        engine_args: dict[str, Any] = {}
        for key in keys:
            values = [(e, e.fields.get(key, _MISSING)) for e in engines]
            distinct = {json.dumps(v, sort_keys=True, default=str) for _, v in values}
            if key in unknown_fields:  # one engine's value is unknown: already reported
                continue
            if len(distinct) > 1:
                shown = ", ".join(f"line {e.line}: {'not set' if v is _MISSING else repr(v)}" for e, v in values)
                self.unknown.append(Unknown(key, engines[0].line, self.snippet(engines[0].call),
                                            f"the script builds {len(engines)} engines that differ in "
                                            f"{key.replace('engine_args.', '')} ({shown})",
                                            "Ekka diagnoses one engine configuration: keep the one that "
                                            "shows the bug"))
                continue
            value = values[0][1]
            if key.startswith("engine_args."):
                engine_args[key.split(".", 1)[1]] = value
            else:
                fields[key] = value
        if len(engines) > 1:
            self.note(f"the script builds {len(engines)} engines (lines "
                      f"{', '.join(str(e.line) for e in engines)}); settings they share are imported")
        fields["engine_args"] = engine_args


@dataclass(frozen=True)
class _Opaque:
    """A sampling parameter whose value is not a literal (it is ignored anyway: Ekka decodes greedily)."""

    text: str

    def __repr__(self) -> str:
        return self.text


_MISSING = object()


def _show(v: Any) -> str:
    return v.text if isinstance(v, _Opaque) else repr(v)


def _string_parts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.ConcatenatedString):
        return _string_parts(node.left) + _string_parts(node.right)
    return [node]


def _ast_string(tree: ast.expr) -> str | None:
    if isinstance(tree, ast.Constant):
        return tree.value if isinstance(tree.value, str) else None
    if isinstance(tree, ast.JoinedStr):
        parts = [_ast_string(v) for v in tree.values]
        return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
    return None


def _toml_problem(value: Any) -> str | None:
    """Why a value cannot go into the TOML spec, or None when it can."""
    if value is None:
        return "None inside the value (TOML has no null)"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text with a lone surrogate (not valid Unicode)"
        return None
    if isinstance(value, (bool, int, float)):
        return None
    if isinstance(value, list):
        return next((p for p in map(_toml_problem, value) if p), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a dict with non-string keys (TOML tables need string keys)"
        return next((p for p in map(_toml_problem, value.values()) if p), None)
    return f"a {type(value).__name__} value"


def _libcst_version() -> str:
    try:
        from importlib.metadata import version
        return version("libcst")
    except Exception:  # noqa: BLE001 - only used in a message
        return "(unknown version)"


def _checkpoint_dtype(model: Any, script: Path) -> str | None:
    """The dtype a local checkpoint declares in its config.json (what dtype='auto' resolves to), if readable."""
    if not isinstance(model, str) or not model:
        return None
    for base in (Path(model).expanduser(), script.parent / model):
        cfg = base / "config.json"
        try:
            data = json.loads(cfg.read_text())
        except (OSError, ValueError):
            continue
        declared = data.get("torch_dtype") or data.get("dtype") or (data.get("text_config") or {}).get("torch_dtype")
        if isinstance(declared, str) and declared in ("bfloat16", "float16"):
            return declared
        return None
    return None
