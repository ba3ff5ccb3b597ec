"""Stage 2, static half — model source files read with libcst, never imported.

The dynamic Model Tree (``ekka_core.tree.build_tree``) says which modules ran; this module says what their source
declares: per class its bases, the line of its ``class`` statement, literal class attributes
(``packed_modules_mapping``, ``stacked_params_mapping`` — also the local one inside ``load_weights``), the
submodules ``__init__`` assigns (``self.qkv_proj = QKVParallelLinear(...)``, ``make_layers(...)`` lists) and the
ordered calls ``forward`` makes (``self.qkv_proj(...)`` → ``("self", "qkv_proj")``, ``apply_rotary_pos_emb(...)``).

Nothing here imports the parsed code, so SGLang's CUDA-only model files parse on a CPU machine.

Entry points: :func:`parse_module_source` (one file → :class:`StaticModule`), :class:`StaticIndex` (many files,
lookup by class name, the exact class source for an agent's ``get_class_definition`` tool, and the forward line
where ``self.<attr>(`` is called), :func:`locate_source_of` (dotted module name → file, without importing).

Line numbers come from a lean libcst metadata provider (:class:`LineProvider`; :func:`line_table` runs the same
code-generation pass without ``MetadataWrapper``'s extra visitor pass): it records the same syntactic start lines as
``libcst.metadata.PositionProvider`` but only for the node types used here, several times faster on a whole models
directory (the tests compare the two).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata.base_provider import BaseMetadataProvider

from ekka_core.contracts.errors import BadInput

SCHEMA = "ekka.static/1"

__all__ = [
    "LineProvider", "line_table", "StaticAttribute", "StaticCall", "StaticClass", "StaticIndex", "StaticMethod", "StaticModule",
    "StaticSubmodule", "locate_source_of", "module_name_for", "parse_module_source", "static_index_for_tree",
]


# --------------------------------------------------------------------------------------------------------------------
# Artefacts

@dataclass
class StaticCall:
    """One call a method makes, in execution (call-start) order: arguments' calls come before the call itself.

    ``receiver`` is ``"self"`` for ``self.<name>(...)`` (``name`` may be dotted: ``"mlp.experts"``) and ``None`` for
    a function call (``"apply_rotary_pos_emb"``, ``"torch.matmul"``). ``kind``: ``submodule`` (a submodule the class
    assigns), ``method`` (a method of the class — its own calls follow, with ``via`` naming it), ``self`` (another
    ``self.`` attribute: an inherited submodule or method the index could not see), ``function``.
    ``alias`` is the local name a submodule was called through (``layer`` in ``for layer in self.layers``).
    ``conditional``: inside an ``if``/``else``/ternary/``except``/``or``; ``in_loop``: inside a loop or comprehension.
    ``file`` is set only when the call was inlined from a method defined in another file (an indexed base class).
    """

    name: str
    receiver: str | None
    line: int
    kind: str = "function"
    via: str | None = None
    alias: str | None = None
    conditional: bool = False
    in_loop: bool = False
    file: str | None = None

    @property
    def target(self) -> tuple[str, str] | str:
        return (self.receiver, self.name) if self.receiver else self.name

    def text(self) -> str:
        return f"{self.receiver}.{self.name}" if self.receiver else self.name


@dataclass
class StaticMethod:
    name: str
    line: int                       # line of the ``def`` keyword
    end_line: int
    params: list[str] = field(default_factory=list)
    calls: list[StaticCall] = field(default_factory=list)   # this method's own calls (no inlining)
    returns: list[str] = field(default_factory=list)        # dotted callee of each ``return Foo(...)``


@dataclass
class StaticSubmodule:
    """``self.<name> = <constructor>(...)`` in ``__init__`` (or a helper it calls: ``method``).

    ``kind``: ``class`` (CamelCase constructor), ``parameter`` (``nn.Parameter`` / ``nn.Buffer``), ``factory`` (a lower-case function such as ``get_rope`` — may also be
    a non-module value), ``list`` (``nn.ModuleList`` / ``make_layers`` …: ``element`` is the element constructor when
    determinable), ``alias`` (``self.lm_head = self.model.embed_tokens``: ``constructor`` is the aliased path).
    ``qualname`` is the constructor's dotted import path when the file imports it (``vllm.….linear.QKVParallelLinear``).
    ``candidates``: other constructors seen for the same attribute (if/else branches, a local ``attn_cls`` chosen by
    a ternary). ``via``: the local name or method the constructor went through (``attn_cls``, ``_init_model``).
    """

    name: str
    constructor: str | None
    line: int
    kind: str
    method: str = "__init__"
    element: str | None = None
    qualname: str | None = None
    candidates: list[str] = field(default_factory=list)
    via: str | None = None


@dataclass
class StaticAttribute:
    """A literal the class declares. ``scope``: ``class`` (class body), ``instance`` (``self.x = …`` in ``__init__``),
    ``local`` (a ``*mapping*`` local variable in a method, e.g. ``stacked_params_mapping`` in ``load_weights``).
    ``kind``: ``literal`` (``value`` is the Python value), ``call`` (a constructor with literal arguments:
    ``{"call": "WeightsMapper", "args": [...], "kwargs": {...}}``), ``ref`` (a dotted name: ``LlamaModel.hf_to_vllm_mapper``).
    """

    name: str
    value: Any
    line: int
    scope: str = "class"
    kind: str = "literal"
    method: str | None = None


@dataclass
class StaticClass:
    name: str
    file: str
    line: int                       # the ``class`` keyword (1-based)
    end_line: int
    first_line: int                 # first decorator line, else ``line``
    bases: list[str] = field(default_factory=list)
    module: str | None = None
    attributes: list[StaticAttribute] = field(default_factory=list)
    submodules: dict[str, StaticSubmodule] = field(default_factory=dict)
    methods: dict[str, StaticMethod] = field(default_factory=dict)
    forward_calls: list[StaticCall] = field(default_factory=list)   # forward, own methods inlined (see ``via``)
    decorators: list[str] = field(default_factory=list)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name

    @property
    def forward_line(self) -> int | None:
        m = self.methods.get("forward")
        return m.line if m else None

    def literal(self, name: str, scope: str | None = None) -> Any:
        """Value of the literal ``name``: class attribute first, then instance, then a method's local; ``None``."""
        order = {"class": 0, "instance": 1, "local": 2}
        hits = sorted((a for a in self.attributes if a.name == name and (scope is None or a.scope == scope)),
                      key=lambda a: order.get(a.scope, 3))
        return hits[0].value if hits else None

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self) | {"qualname": self.qualname, "forward_line": self.forward_line})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StaticClass":
        data = {k: v for k, v in data.items() if k not in ("qualname", "forward_line")}
        data["attributes"] = [StaticAttribute(**a) for a in data.get("attributes", [])]
        data["submodules"] = {k: StaticSubmodule(**s) for k, s in data.get("submodules", {}).items()}
        data["methods"] = {k: StaticMethod(**(m | {"calls": [StaticCall(**c) for c in m.get("calls", [])]}))
                           for k, m in data.get("methods", {}).items()}
        data["forward_calls"] = [StaticCall(**c) for c in data.get("forward_calls", [])]
        return cls(**data)

    def render(self) -> str:
        """A few lines an engineer or an agent reads: header, submodules, forward call order, literals."""
        bases = f"({', '.join(self.bases)})" if self.bases else ""
        out = [f"{self.name}{bases}  {self.file}:{self.line}"]
        if self.submodules:
            parts = []
            for s in self.submodules.values():
                ctor = s.constructor or "?"
                if s.kind == "list":
                    ctor = f"{ctor}[{s.element or '?'}]"
                elif s.kind == "alias":
                    ctor = f"alias:self.{ctor}"
                if s.via:
                    ctor = f"{s.via}→{ctor}"
                if s.candidates:
                    ctor += "|" + "|".join(s.candidates)
                where = f":{s.line}" + (f"@{s.method}" if s.method != "__init__" else "")
                parts.append(f"{s.name}={ctor}{where}")
            out.append("  submodules: " + "  ".join(parts))
        if self.forward_line is not None:
            shown = [f"{c.text().removeprefix('self.')}{'()' if c.kind == 'method' else ''}:{c.line}"
                     + ("?" if c.conditional else "") for c in self.forward_calls]
            out.append(f"  forward:{self.forward_line}  " + " → ".join(shown))
        for a in self.attributes:
            if a.scope == "class" or "mapping" in a.name.lower():
                text = json.dumps(_jsonable(a.value))
                out.append(f"  {a.name}{'' if a.scope == 'class' else f' [{a.scope}:{a.method}]'} = "
                           f"{text if len(text) <= 160 else text[:157] + '...'}")
        return "\n".join(out)


@dataclass
class StaticModule:
    path: str
    module: str | None
    classes: dict[str, StaticClass] = field(default_factory=dict)
    functions: dict[str, int] = field(default_factory=dict)     # top-level ``def`` → line
    imports: dict[str, str] = field(default_factory=dict)       # local name → dotted origin
    parse_seconds: float = 0.0
    source: str = field(default="", repr=False)                 # the decoded file text (not in JSON)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "path": self.path, "module": self.module, "functions": self.functions,
                "imports": self.imports, "parse_seconds": round(self.parse_seconds, 4),
                "classes": [c.to_json() for c in self.classes.values()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StaticModule":
        if data.get("schema") != SCHEMA:
            raise BadInput(f"not a static module record (schema {data.get('schema')!r}, expected {SCHEMA!r})")
        classes = [StaticClass.from_json(c) for c in data.get("classes", [])]
        return cls(path=data["path"], module=data.get("module"), classes={c.name: c for c in classes},
                   functions=dict(data.get("functions", {})), imports=dict(data.get("imports", {})),
                   parse_seconds=data.get("parse_seconds", 0.0))

    def render(self) -> str:
        head = f"# {self.module or self.path}  ({self.path})"
        return "\n".join([head, *(c.render() for c in self.classes.values())])

    def class_source(self, name: str) -> str:
        c = self.classes[name]
        text = self.source or Path(self.path).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)[c.first_line - 1:c.end_line]
        while lines and not lines[-1].strip():
            lines.pop()
        return "".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# Line numbers: a lean PositionProvider

_WANTED = (cst.ClassDef, cst.FunctionDef, cst.Decorator, cst.Call, cst.Assign, cst.AnnAssign, cst.For,
           cst.Return, cst.Lambda)
_NULL = contextlib.nullcontext()


class _Record:
    __slots__ = ("state", "node", "start")

    def __init__(self, state: "_LineState", node: cst.CSTNode):
        self.state, self.node = state, node

    def __enter__(self) -> None:
        self.start = self.state.line

    def __exit__(self, *exc: object) -> None:
        self.state.table[self.node] = (self.start, self.state.line)


@dataclass
class _LineState(CodegenState):
    line: int = 1
    newline: str = "\n"
    table: dict = field(default_factory=dict)

    def add_indent_tokens(self) -> None:     # indentation never holds a newline; nothing to count or keep
        pass

    def add_token(self, value: str) -> None:
        if self.newline in value:
            self.line += value.count(self.newline)

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> Any:
        return _Record(self, node) if isinstance(node, _WANTED) else _NULL


class LineProvider(BaseMetadataProvider[tuple[int, int]]):
    """``(start_line, line_after)`` per class, def, decorator, call, assignment, for, return and lambda node.

    ``start_line`` equals ``PositionProvider``'s ``start.line`` (the syntactic start: ``class``/``def`` keyword, a
    call's first token). ``line_after`` is the line the code generator is on when the node is done; for a
    ``class``/``def`` whose body ends with a newline that is the line after its last line.
    """

    def _gen_impl(self, module: cst.Module) -> None:
        self._computed.update(line_table(module))


def line_table(module: cst.Module) -> dict[cst.CSTNode, tuple[int, int]]:
    """What :class:`LineProvider` provides, computed directly: going through ``MetadataWrapper.resolve`` also runs
    an (empty) batched visitor pass over the whole tree, which costs about as much as the line pass itself."""
    nl = "\r" if module.default_newline == "\r" else "\n"
    state = _LineState(default_indent=module.default_indent, default_newline=module.default_newline, newline=nl)
    module._codegen(state)
    return state.table


# --------------------------------------------------------------------------------------------------------------------
# Parsing

_BUILTINS = frozenset(dir(__import__("builtins")))
_LIST_MAKERS = {"ModuleList", "Sequential", "ModuleDict", "ParameterList"}
_LIST_MAKER_RE = re.compile(r"^make_(\w+_)?layers$")


def _dotted(node: cst.CSTNode) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def _self_path(node: cst.CSTNode) -> str | None:
    """``x.y`` for ``self.x.y``, ``self.x.y[...]`` and ``self.x[i].y`` (subscripts dropped); else None."""
    parts: list[str] = []
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name) and node.value == "self" and parts:
        return ".".join(reversed(parts))
    return None


def _camel(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return bool(last) and last[0].isupper()


def _is_list_maker(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last in _LIST_MAKERS or bool(_LIST_MAKER_RE.match(last))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else repr(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, (bytes, complex)):
        return repr(value)
    return value


_SKIP_FIELDS = frozenset({"lpar", "rpar", "comma", "semicolon", "leading_lines", "lines_after_decorators", "header",
                          "footer", "indent", "trailing_whitespace", "equal", "dot", "colon", "asynchronous",
                          "newline", "relative"})
_FIELDS: dict[type, tuple[str, ...]] = {}


def _children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Child nodes in field order (source order for expressions), without libcst's slow visitor machinery and
    without whitespace/punctuation."""
    names = _FIELDS.get(type(node))
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(node)
                      if not f.name.startswith("whitespace") and f.name not in _SKIP_FIELDS)
        _FIELDS[type(node)] = names
    for name in names:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, cst.CSTNode):
                    yield item


def _descendants(node: cst.CSTNode, prune: tuple[type, ...] = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
                 ) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (pre-order), not descending into nested ``prune`` nodes."""
    stack = list(_children(node))
    stack.reverse()
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, prune):
            kids = list(_children(n))
            kids.reverse()
            stack.extend(kids)


def _suites(stmt: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The blocks a compound statement holds (not a nested def's or class's)."""
    if isinstance(stmt, cst.If):
        yield stmt.body
        if isinstance(stmt.orelse, cst.If):
            yield from _suites(stmt.orelse)
        elif stmt.orelse is not None:
            yield stmt.orelse.body
    elif isinstance(stmt, (cst.For, cst.While)):
        yield stmt.body
        if stmt.orelse is not None:
            yield stmt.orelse.body
    elif isinstance(stmt, (cst.Try, cst.TryStar)):
        yield stmt.body
        for h in stmt.handlers:
            yield h.body
        if stmt.orelse is not None:
            yield stmt.orelse.body
        if stmt.finalbody is not None:
            yield stmt.finalbody.body
    elif isinstance(stmt, cst.With):
        yield stmt.body
    elif isinstance(stmt, cst.Match):
        for case in stmt.cases:
            yield case.body


def _statements(body: Sequence[cst.CSTNode], *, into_defs: bool = False) -> Iterator[cst.CSTNode]:
    """Statements of a block in source order, small statements (``x = 1``, ``import y``) included, descending into
    compound statements (and into nested defs/classes only with ``into_defs``)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            yield from stmt.body
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            if into_defs:
                yield from _statements(stmt.body.body, into_defs=True)
        else:
            for suite in _suites(stmt):
                yield from _statements(suite.body, into_defs=into_defs)


_LITERAL_NODES = (cst.SimpleString, cst.ConcatenatedString, cst.Integer, cst.Float, cst.Imaginary, cst.List,
                  cst.Tuple, cst.Dict, cst.Set, cst.UnaryOperation, cst.Name)


class _Parser:
    def __init__(self, path: Path, module_name: str | None):
        self.path = path
        self.module_name = module_name
        raw = path.read_bytes()
        started = time.perf_counter()
        try:
            self.tree = cst.parse_module(raw)
        except cst.ParserSyntaxError as err:
            raise BadInput(f"cannot parse {path}: line {err.raw_line}, column {err.raw_column + 1}: {err.message}",
                           fix="static parsing needs a syntactically valid Python file; check the path and "
                               "that the file is not truncated") from None
        except (UnicodeDecodeError, LookupError) as err:
            raise BadInput(f"cannot decode {path}: {err}", fix="the file must be Python source text") from None
        self.lines = line_table(self.tree)
        self.source = raw.decode(self.tree.encoding, errors="replace")
        self.started = started
        self.imports: dict[str, str] = {}
        self.globals_defined: set[str] = set()

    def line(self, node: cst.CSTNode) -> int:
        return self.lines[node][0]

    def code(self, node: cst.CSTNode) -> str:
        return self.tree.code_for_node(node)

    # ---- module level
    def run(self) -> StaticModule:
        mod = StaticModule(path=str(self.path), module=self.module_name, source=self.source)
        self._collect_imports()
        for stmt in self.tree.body:
            if isinstance(stmt, cst.ClassDef):
                self.globals_defined.add(stmt.name.value)
            elif isinstance(stmt, cst.FunctionDef):
                self.globals_defined.add(stmt.name.value)
                mod.functions[stmt.name.value] = self.line(stmt)
        mod.imports = dict(self.imports)
        for stmt in self._top_level_statements(self.tree.body):
            if isinstance(stmt, cst.ClassDef):
                cls = self._class(stmt)
                mod.classes.setdefault(cls.name, cls)
        mod.parse_seconds = time.perf_counter() - self.started
        return mod

    def _top_level_statements(self, body: Sequence[cst.CSTNode]) -> Iterator[cst.CSTNode]:
        """Top-level statements, descending into ``if``/``try`` blocks (``if TYPE_CHECKING:`` … ``else:`` classes)."""
        for stmt in body:
            yield stmt
            if isinstance(stmt, (cst.If, cst.Try)):
                for block in self._blocks(stmt):
                    yield from self._top_level_statements(block)

    @staticmethod
    def _blocks(stmt: cst.CSTNode) -> Iterator[Sequence[cst.CSTNode]]:
        if isinstance(stmt, cst.If):
            yield stmt.body.body
            if stmt.orelse is not None:
                if isinstance(stmt.orelse, cst.If):
                    yield [stmt.orelse]
                else:
                    yield stmt.orelse.body.body
        elif isinstance(stmt, cst.Try):
            yield stmt.body.body
            for h in stmt.handlers:
                yield h.body.body
            if stmt.orelse is not None:
                yield stmt.orelse.body.body

    def _collect_imports(self) -> None:
        package = None
        if self.module_name:
            package = self.module_name if self.path.name == "__init__.py" else self.module_name.rpartition(".")[0]
        for node in _statements(self.tree.body, into_defs=True):
            if isinstance(node, cst.Import):
                for alias in node.names:
                    full = _dotted(alias.name) or ""
                    local = alias.asname.name.value if alias.asname else full.split(".")[0]
                    self.imports.setdefault(local, full if alias.asname else full.split(".")[0])
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                base = _dotted(node.module) if node.module is not None else ""
                dots = len(node.relative)
                if dots:
                    if package is None:
                        base = "." * dots + (base or "")
                    else:
                        parts = package.split(".")
                        parts = parts[:len(parts) - (dots - 1)]
                        base = ".".join([*parts, *([base] if base else [])])
                for alias in node.names:
                    name = _dotted(alias.name) or ""
                    local = alias.asname.name.value if alias.asname else name
                    self.imports.setdefault(local, f"{base}.{name}" if base else name)

    def resolve(self, dotted: str | None) -> str | None:
        """Dotted import origin of a name as written in this file (``nn.Linear`` → ``torch.nn.Linear``)."""
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.imports:
            origin = self.imports[head]
            return f"{origin}.{rest}" if rest else origin
        if head in self.globals_defined and self.module_name:
            return f"{self.module_name}.{dotted}"
        return None

    # ---- classes
    def _class(self, node: cst.ClassDef) -> StaticClass:
        start, after = self.lines[node]
        first = min([self.line(d) for d in node.decorators] or [start])
        cls = StaticClass(
            name=node.name.value, file=str(self.path), line=start, end_line=after - 1, first_line=first,
            module=self.module_name,
            bases=[_dotted(a.value) or self.code(a.value).strip() for a in node.bases],
            decorators=[self.code(d.decorator).strip() for d in node.decorators])
        funcs: dict[str, cst.FunctionDef] = {}
        for stmt in self._top_level_statements(node.body.body if isinstance(node.body, cst.IndentedBlock) else []):
            if isinstance(stmt, cst.FunctionDef):
                funcs.setdefault(stmt.name.value, stmt)
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    self._class_attribute(cls, small)
        # Submodules: __init__ first, then the helpers it calls (``self._init_rotary_emb(...)``), in call order.
        init_order: list[str] = []
        pending = ["__init__"]
        while pending:
            name = pending.pop(0)
            if name in init_order or name not in funcs:
                continue
            init_order.append(name)
            pending.extend(self._self_method_calls(funcs[name], funcs))
        for name in init_order:
            self._submodules(cls, funcs[name], funcs)
        for name, fn in funcs.items():
            cls.methods[name] = self._method(fn, cls)
            self._local_literals(cls, fn)
        # Constructors that are a self-method's return value: ``self.model = self._init_model(...)``.
        for sub in cls.submodules.values():
            if sub.kind == "method" and sub.constructor in cls.methods:
                returns = cls.methods[sub.constructor].returns
                sub.via, sub.constructor = sub.constructor, (returns[0] if returns else None)
                sub.candidates = [r for r in returns[1:] if r != sub.constructor]
                sub.kind = self._kind_of(sub.constructor) if sub.constructor else "unknown"
                sub.qualname = self.resolve(sub.constructor)
        cls.forward_calls = flatten_calls(
            "forward", lambda n: (cls.methods.get(n), None), lambda n: n in cls.submodules)
        return cls

    def _class_attribute(self, cls: StaticClass, small: cst.CSTNode) -> None:
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            name, value = small.targets[0].target.value, small.value
        elif isinstance(small, cst.AnnAssign) and small.value is not None and isinstance(small.target, cst.Name):
            name, value = small.target.value, small.value
        else:
            return
        got = self._value(value, allow_ref=True)
        if got is not None:
            cls.attributes.append(StaticAttribute(name, got[1], self.line(small), "class", got[0]))

    def _literal(self, node: cst.CSTNode) -> tuple[bool, Any]:
        if not isinstance(node, _LITERAL_NODES):
            return False, None
        if isinstance(node, cst.Name) and node.value not in ("None", "True", "False"):
            return False, None
        try:
            return True, ast.literal_eval(self.code(node).strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return False, None

    def _value(self, node: cst.CSTNode, *, allow_ref: bool) -> tuple[str, Any] | None:
        ok, value = self._literal(node)
        if ok:
            return "literal", value
        if isinstance(node, cst.Call) and (callee := _dotted(node.func)) is not None and allow_ref:
            args, kwargs = [], {}
            for arg in node.args:
                ok, v = self._literal(arg.value)
                if not ok or arg.star:
                    return None
                if arg.keyword is not None:
                    kwargs[arg.keyword.value] = v
                else:
                    args.append(v)
            return "call", {"call": callee, "args": args, "kwargs": kwargs}
        if allow_ref and (ref := _dotted(node)) is not None:
            return "ref", ref
        return None

    def _local_literals(self, cls: StaticClass, fn: cst.FunctionDef) -> None:
        """``*mapping*`` locals in any method and literal ``self.x = …`` in ``__init__``."""
        for node in _statements(fn.body.body):
            if not isinstance(node, cst.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0].target
            if isinstance(target, cst.Name) and "mapping" in target.value.lower():
                ok, value = self._literal(node.value)
                if ok:
                    cls.attributes.append(StaticAttribute(target.value, value, self.line(node), "local",
                                                          "literal", fn.name.value))
            elif (fn.name.value == "__init__" and isinstance(target, cst.Attribute)
                  and (path := _self_path(target)) and "." not in path):
                ok, value = self._literal(node.value)
                if ok:
                    cls.attributes.append(StaticAttribute(path, value, self.line(node), "instance",
                                                          "literal", "__init__"))

    # ---- submodules
    @staticmethod
    def _self_method_calls(fn: cst.FunctionDef, funcs: dict[str, cst.FunctionDef]) -> list[str]:
        found: list[str] = []
        for node in _descendants(fn.body):
            if isinstance(node, cst.Call):
                p = _self_path(node.func)
                if p and p in funcs and p not in found:
                    found.append(p)
        return found

    @staticmethod
    def _kind_of(ctor: str) -> str:
        last = ctor.rsplit(".", 1)[-1]
        if last in ("Parameter", "Buffer", "UninitializedParameter", "UninitializedBuffer"):
            return "parameter"
        return "list" if _is_list_maker(ctor) else "class" if _camel(ctor) else "factory"

    def _locals_of(self, fn: cst.FunctionDef) -> dict[str, list[cst.CSTNode]]:
        """Local name → the expressions assigned to it (and a parameter's default)."""
        out: dict[str, list[cst.CSTNode]] = {}
        params = fn.params
        for p in [*params.posonly_params, *params.params, *params.kwonly_params]:
            if p.default is not None:
                out.setdefault(p.name.value, []).append(p.default)
        for node in _statements(fn.body.body):
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    if isinstance(t.target, cst.Name):
                        out.setdefault(t.target.value, []).append(node.value)
            elif isinstance(node, cst.AnnAssign) and isinstance(node.target, cst.Name) and node.value is not None:
                out.setdefault(node.target.value, []).append(node.value)
        return out

    def _candidates(self, name: str, local: dict[str, list[cst.CSTNode]], depth: int = 0) -> list[str]:
        """Constructors a local name may hold: ``attn_cls = A if c else B`` → [A, B]; a parameter default."""
        out: list[str] = []

        def add(expr: cst.CSTNode) -> None:
            if isinstance(expr, cst.IfExp):
                add(expr.body)
                add(expr.orelse)
            elif (d := _dotted(expr)) is not None:
                if d in local and depth < 3 and d != name:
                    out.extend(self._candidates(d, local, depth + 1))
                elif d not in ("None", "True", "False"):
                    out.append(d)

        for expr in local.get(name, []):
            add(expr)
        return list(dict.fromkeys(out))

    def _element_of(self, call: cst.Call, local: dict[str, list[cst.CSTNode]]) -> tuple[str | None, list[str]]:
        """Element constructor of ``nn.ModuleList([X(...) for ...])`` / ``make_layers(n, lambda p: X(...))``."""
        def from_expr(expr: cst.CSTNode) -> str | None:
            if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
                return from_expr(expr.elt)
            if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements:
                return from_expr(expr.elements[0].value)
            if isinstance(expr, cst.Lambda):
                return from_expr(expr.body)
            if isinstance(expr, cst.Call):
                return _dotted(expr.func)
            return None

        for arg in call.args:
            if isinstance(arg.value, cst.Lambda) or arg.keyword is None:
                elem = from_expr(arg.value)
                if elem is not None:
                    if elem in local:
                        cands = self._candidates(elem, local)
                        if len(cands) == 1:
                            return cands[0], []
                        return elem, cands
                    return elem, []
        return None, []

    def _submodules(self, cls: StaticClass, fn: cst.FunctionDef, funcs: dict[str, cst.FunctionDef]) -> None:
        local = self._locals_of(fn)
        parser, method = self, fn.name.value

        def record(names: list[str], value: cst.CSTNode, line: int) -> None:
            sub = parser._submodule_for(names, value, line, method, local, funcs)
            if sub is None:
                return
            name = sub.name
            existing = cls.submodules.get(name)
            if existing is None:
                cls.submodules[name] = sub
                return
            alt = sub.constructor if sub.kind != "alias" else f"alias:self.{sub.constructor}"
            if existing.kind in ("alias", "unknown") and sub.kind not in ("alias", "unknown"):
                sub.candidates = [c for c in [f"alias:self.{existing.constructor}" if existing.kind == "alias"
                                              else existing.constructor, *existing.candidates] if c]
                cls.submodules[name] = sub
            elif alt and alt != existing.constructor and alt not in existing.candidates and sub.kind != "unknown":
                existing.candidates.append(alt)

        for node in _statements(fn.body.body):
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    target = t.target
                    if isinstance(target, (cst.Tuple, cst.List)):
                        names = [_self_path(e.value) if isinstance(e.value, cst.Attribute) else None
                                 for e in target.elements]
                        if names and all(names) and not any("." in n for n in names):
                            record(names, node.value, self.line(node))
                    elif isinstance(target, cst.Attribute) and (p := _self_path(target)) and "." not in p:
                        record([p], node.value, self.line(node))
            elif isinstance(node, cst.AnnAssign) and node.value is not None and isinstance(node.target, cst.Attribute):
                if (p := _self_path(node.target)) and "." not in p:
                    record([p], node.value, self.line(node))

    def _submodule_for(self, names: list[str], value: cst.CSTNode, line: int, method: str,
                       local: dict[str, list[cst.CSTNode]], funcs: dict[str, cst.FunctionDef]
                       ) -> StaticSubmodule | None:
        if isinstance(value, cst.Call):
            callee = _dotted(value.func)
            if callee is None:
                return None
            if len(names) > 1:
                # ``self.start, self.end, self.layers = make_layers(...)``: the list goes to the one name that is
                # not a start/end index (or the one ending in ``layers``).
                if not _is_list_maker(callee):
                    return None
                rest = [n for n in names if not re.search(r"(^|_)(start|end)(_|$)", n)]
                if len(rest) != 1:
                    rest = [n for n in names if n.endswith("layers")][:1]
                if not rest:
                    return None
                names = rest
            name = names[0]
            if callee.startswith("self."):
                meth = callee[5:]
                if meth in funcs:
                    return StaticSubmodule(name, meth, line, "method", method)
                return None      # ``self.lm_head.tie_weights(...)``: a value derived from another attribute
            if callee in _BUILTINS and callee not in self.imports and callee not in self.globals_defined:
                return None
            if callee in local and callee not in self.imports:
                cands = self._candidates(callee, local)
                if not cands:
                    return None
                kind = self._kind_of(cands[0])
                return StaticSubmodule(name, cands[0], line, kind, method, qualname=self.resolve(cands[0]),
                                       candidates=cands[1:], via=callee)
            kind = self._kind_of(callee)
            sub = StaticSubmodule(name, callee, line, kind, method, qualname=self.resolve(callee))
            if kind == "list":
                sub.element, sub.candidates = self._element_of(value, local)
            return sub
        if len(names) == 1 and (path := _self_path(value)) is not None and isinstance(value, cst.Attribute):
            return StaticSubmodule(names[0], path, line, "alias", method)
        return None

    # ---- calls
    def _method(self, fn: cst.FunctionDef, cls: StaticClass) -> StaticMethod:
        start, after = self.lines[fn]
        params = [p.name.value for p in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]]
        walker = _CallWalker(self, cls)
        walker.walk(fn.body, False, False)
        returns = [d for node in _statements(fn.body.body)
                   if isinstance(node, cst.Return) and isinstance(node.value, cst.Call)
                   and (d := _dotted(node.value.func))]
        return StaticMethod(fn.name.value, start, after - 1, params, walker.calls, returns)


class _CallWalker:
    """Calls of one method body in call-start order (func sub-expressions, then arguments, then the call)."""

    def __init__(self, parser: _Parser, cls: StaticClass):
        self.p = parser
        self.cls = cls
        self.calls: list[StaticCall] = []
        self.aliases: dict[str, str] = {}     # local name → self attribute it stands for

    def walk(self, node: cst.CSTNode, cond: bool, loop: bool) -> None:
        w = self.walk
        if isinstance(node, cst.Call):
            self.call(node, cond, loop)
        elif isinstance(node, cst.If):
            w(node.test, cond, loop)
            w(node.body, True, loop)
            if node.orelse is not None:
                w(node.orelse, True, loop)
        elif isinstance(node, cst.For):
            w(node.iter, cond, loop)
            self.bind_loop(node.target, node.iter)
            w(node.body, cond, True)
            if node.orelse is not None:
                w(node.orelse, True, loop)
        elif isinstance(node, cst.While):
            w(node.test, cond, True)
            w(node.body, cond, True)
            if node.orelse is not None:
                w(node.orelse, True, loop)
        elif isinstance(node, cst.Try):
            w(node.body, cond, loop)
            for h in node.handlers:
                w(h, True, loop)
            if node.orelse is not None:
                w(node.orelse, True, loop)
            if node.finalbody is not None:
                w(node.finalbody, cond, loop)
        elif isinstance(node, cst.IfExp):
            w(node.test, cond, loop)
            w(node.body, True, loop)
            w(node.orelse, True, loop)
        elif isinstance(node, cst.BooleanOperation):
            w(node.left, cond, loop)
            w(node.right, True, loop)
        elif isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            w(node.for_in, cond, True)
            if isinstance(node, cst.DictComp):
                w(node.key, cond, True)
                w(node.value, cond, True)
            else:
                w(node.elt, cond, True)
        elif isinstance(node, cst.CompFor):
            w(node.iter, cond, loop)
            self.bind_loop(node.target, node.iter)
            for cif in node.ifs:
                w(cif, cond, loop)
            if node.inner_for_in is not None:
                w(node.inner_for_in, cond, loop)
        elif isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            body = node.body
            w(body, True, loop)
        elif isinstance(node, cst.Assign):
            w(node.value, cond, loop)
            for t in node.targets:
                w(t, cond, loop)
            if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                src = _self_path(node.value)
                name = node.targets[0].target.value
                if src is not None and src.split(".")[0] in self.cls.submodules:
                    self.aliases[name] = src
                else:
                    self.aliases.pop(name, None)
        else:
            for child in _children(node):
                w(child, cond, loop)

    def bind_loop(self, target: cst.CSTNode, it: cst.CSTNode) -> None:
        attrs: list[str] = []
        stack = [it]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Attribute) and (p := _self_path(node)) is not None:
                attrs.append(p)
                continue
            stack.extend(reversed(list(_children(node))))
        subs = self.cls.submodules
        best = next((a for a in attrs if a in subs and subs[a].kind == "list"), None) \
            or next((a for a in attrs if a.split(".")[0] in subs), None)
        names = [target] if isinstance(target, cst.Name) else \
            [e.value for e in getattr(target, "elements", []) if isinstance(e.value, cst.Name)]
        for n in names:
            if best is not None:
                self.aliases[n.value] = best
            else:
                self.aliases.pop(n.value, None)

    def call(self, node: cst.Call, cond: bool, loop: bool) -> None:
        func = node.func
        record: StaticCall | None = None
        line = self.p.line(node)
        if isinstance(func, cst.Name):
            name = func.value
            if name in self.aliases:
                record = StaticCall(self.aliases[name], "self", line, "self", alias=name)
            elif name not in _BUILTINS or name in self.p.imports or name in self.p.globals_defined:
                record = StaticCall(name, None, line, "function")
        else:
            # the callee's own sub-expressions run first: ``self.q_proj(h).view(...)`` calls q_proj, then view
            if isinstance(func, cst.Attribute):
                self.walk(func.value, cond, loop)
            else:
                self.walk(func, cond, loop)
            if (path := _self_path(func)) is not None:
                record = StaticCall(path, "self", line, "self")
            elif isinstance(func, cst.Attribute) and (d := _dotted(func)) is not None:
                head = d.split(".")[0]
                if head in self.aliases:
                    record = StaticCall(f"{self.aliases[head]}.{d.partition('.')[2]}", "self", line, "self",
                                        alias=head)
                elif head in self.p.imports or head in self.p.globals_defined:
                    record = StaticCall(d, None, line, "function")
                # else: a method on a local (a tensor, the forward batch): skipped
        for arg in node.args:
            self.walk(arg.value, cond, loop)
        if record is not None:
            record.conditional, record.in_loop = cond, loop
            self.calls.append(record)


def flatten_calls(method: str, lookup: Callable[[str], tuple[StaticMethod | None, str | None]],
                  is_submodule: Callable[[str], bool], *, _stack: tuple[str, ...] = (),
                  _cond: bool = False, _loop: bool = False, _file: str | None = None) -> list[StaticCall]:
    """``method``'s calls with the calls of the class's own methods it reaches inlined after each such call.

    ``lookup(name)`` → (method, file it is defined in or None for the class's own file).
    """
    found, file = lookup(method)
    if found is None:
        return []
    file = file or _file
    out: list[StaticCall] = []
    for c in found.calls:
        call = StaticCall(**asdict(c))
        call.conditional = call.conditional or _cond
        call.in_loop = call.in_loop or _loop
        call.file = call.file or file
        if _stack:
            call.via = ">".join(_stack) if call.via is None else f"{'>'.join(_stack)}>{call.via}"
        if call.receiver == "self":
            head = call.name.split(".")[0]
            if "." not in call.name and lookup(call.name)[0] is not None and not is_submodule(call.name):
                call.kind = "method"
            elif is_submodule(head):
                call.kind = "submodule" if "." not in call.name else "submodule_attr"
        out.append(call)
        if call.kind == "method" and call.name not in _stack and call.name != method and len(_stack) < 8:
            out.extend(flatten_calls(call.name, lookup, is_submodule, _stack=(*_stack, call.name),
                                     _cond=call.conditional, _loop=call.in_loop, _file=file))
    return out


def parse_module_source(path: str | Path, module: str | None = None) -> StaticModule:
    """Parse one Python file with libcst (never imports it). ``module``: its dotted name, derived from the
    ``__init__.py`` chain above it when omitted. A syntax error raises :class:`BadInput` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"no such source file: {p}", fix="pass the path of a Python file")
    return _Parser(p, module if module is not None else module_name_for(p)).run()


# --------------------------------------------------------------------------------------------------------------------
# Locating sources without importing

def module_name_for(path: str | Path, roots: Iterable[str | Path] = ()) -> str | None:
    """Dotted module name of ``path``: relative to the first root that contains it, else from the chain of
    ``__init__.py`` files above it, else ``None``."""
    p = Path(path).resolve()
    for root in roots:
        r = Path(root).resolve()
        try:
            rel = p.relative_to(r)
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts) or None
    parts = [] if p.name == "__init__.py" else [p.stem]
    d = p.parent
    while (d / "__init__.py").is_file():
        parts.insert(0, d.name)
        d = d.parent
    if len(parts) == 1 and not (p.parent / "__init__.py").is_file() and p.name != "__init__.py":
        return None
    return ".".join(parts) or None


def locate_source_of(module_qualname: str, search_paths: Iterable[str | Path] | None = None) -> Path | None:
    """File of ``module_qualname`` (``vllm.model_executor.models.llama`` → ``…/vllm/model_executor/models/llama.py``)
    without importing anything. ``search_paths`` are directories that hold top-level packages (like ``sys.path``
    entries, or the SGLang source cache); without them the top-level package is found with
    ``importlib.util.find_spec`` (which, for a top-level name, runs no package code), then ``sys.path``.
    Packages without ``__init__.py`` (namespace packages, a partial source extract) are walked too."""
    parts = [p for p in module_qualname.split(".") if p]
    if not parts:
        return None
    starts: list[Path] = []
    if search_paths is not None:
        starts = [Path(s) / parts[0] for s in search_paths]
    else:
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            if spec.submodule_search_locations:
                starts.extend(Path(loc) for loc in spec.submodule_search_locations)
            elif spec.origin and spec.origin not in ("built-in", "frozen") and len(parts) == 1:
                return Path(spec.origin)
        starts.extend(Path(s or ".") / parts[0] for s in sys.path)
    for start in starts:
        if len(parts) == 1:
            if (start / "__init__.py").is_file():
                return start / "__init__.py"
            if start.with_suffix(".py").is_file():
                return start.with_suffix(".py")
            continue
        d = start
        for part in parts[1:-1]:
            d = d / part
        leaf = d / parts[-1]
        if leaf.with_suffix(".py").is_file():
            return leaf.with_suffix(".py")
        if (leaf / "__init__.py").is_file():
            return leaf / "__init__.py"
    return None


# --------------------------------------------------------------------------------------------------------------------
# The index

_CLASS_RE = re.compile(rb"^[ \t]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


class StaticIndex:
    """Many parsed files; classes looked up by name (``LlamaAttention``) or qualified name
    (``vllm.model_executor.models.llama.LlamaAttention``). A lazy index scans files for ``class`` names with a
    regular expression and parses a file the first time one of its classes is asked for."""

    def __init__(self) -> None:
        self.modules: dict[str, StaticModule] = {}          # path → parsed module
        self._pending: dict[str, str | None] = {}           # path → module name, not parsed yet
        self._names: dict[str, list[str]] = {}              # class name → paths that (may) define it, in order
        self._by_module: dict[str, str] = {}                # module name → path
        self.errors: dict[str, str] = {}                    # path → why it could not be parsed (on_error="skip")
        self.on_error = "raise"

    # ---- building
    @classmethod
    def from_files(cls, paths: Iterable[str | Path], *, roots: Iterable[str | Path] = (), lazy: bool = False,
                   on_error: str = "raise") -> "StaticIndex":
        index = cls()
        index.on_error = on_error
        roots = list(roots)
        for p in paths:
            index.add_file(p, module_name_for(p, roots), lazy=lazy)
        return index

    @classmethod
    def from_package_dir(cls, directory: str | Path, glob: str = "*.py", *, package: str | None = None,
                         lazy: bool = False, on_error: str = "raise") -> "StaticIndex":
        """Every file under ``directory`` matching ``glob`` (``"*.py"``, ``"**/*.py"``), in sorted order.
        ``package``: the directory's dotted name when no ``__init__.py`` chain tells it (a source extract)."""
        d = Path(directory)
        if not d.is_dir():
            raise BadInput(f"no such source directory: {d}", fix="pass a directory of Python files")
        index = cls()
        index.on_error = on_error
        for p in sorted(d.glob(glob)):
            if not p.is_file():
                continue
            if package is not None:
                rel = p.relative_to(d).with_suffix("").parts
                rel = rel[:-1] if rel[-1] == "__init__" else rel
                name = ".".join([package, *rel])
            else:
                name = module_name_for(p)
            index.add_file(p, name, lazy=lazy)
        return index

    def add_file(self, path: str | Path, module: str | None = None, *, lazy: bool = False) -> None:
        key = str(Path(path))
        if key in self.modules or key in self._pending:
            return
        if module is not None:
            self._by_module.setdefault(module, key)
        if lazy:
            try:
                raw = Path(key).read_bytes()
            except OSError as err:
                raise BadInput(f"cannot read {key}: {err}", fix="pass a readable Python file") from None
            self._pending[key] = module
            for m in _CLASS_RE.finditer(raw):
                self._names.setdefault(m.group(1).decode(), []).append(key)
        else:
            self._pending[key] = module
            if self._load(key) is not None:
                for name in self.modules[key].classes:
                    self._names.setdefault(name, []).append(key)

    def _load(self, key: str) -> StaticModule | None:
        if key in self.modules:
            return self.modules[key]
        if key not in self._pending:
            return None
        module = self._pending.pop(key)
        try:
            mod = parse_module_source(key, module)
        except BadInput as err:
            if self.on_error != "skip":
                raise
            self.errors[key] = str(err)
            return None
        self.modules[key] = mod
        return mod

    def ensure_module(self, module_qualname: str, search_paths: Iterable[str | Path] | None = None
                      ) -> StaticModule | None:
        """Parse (once) the file of a dotted module name, found with :func:`locate_source_of`."""
        if module_qualname in self._by_module:
            return self._load(self._by_module[module_qualname])
        path = locate_source_of(module_qualname, search_paths)
        if path is None:
            return None
        self.add_file(path, module_qualname)
        return self._load(str(path))

    # ---- lookup
    def find_classes(self, name: str) -> list[StaticClass]:
        """Every class called ``name`` (a simple name) or the one a qualified name names."""
        if "." in name:
            module, _, simple = name.rpartition(".")
            key = self._by_module.get(module)
            mod = self._load(key) if key else None
            return [mod.classes[simple]] if mod and simple in mod.classes else []
        out = []
        for key in self._names.get(name, []):
            mod = self._load(key)
            if mod is not None and name in mod.classes:
                out.append(mod.classes[name])
        return out

    def get_class(self, name: str) -> StaticClass | None:
        """The class ``name`` names; for a simple name defined in several files, the first file added."""
        found = self.find_classes(name)
        return found[0] if found else None

    def class_source(self, name: str) -> str:
        """The exact source text of the class, decorators included (for an agent's ``get_class_definition``)."""
        c = self.get_class(name)
        if c is None:
            raise BadInput(f"no class {name!r} in the static index", fix="check the class name and the files indexed")
        return self.modules[c.file].class_source(c.name)

    def mro(self, name: str) -> list[StaticClass]:
        """The class and its bases that the index can see (depth-first, left to right, each once)."""
        start = self.get_class(name)
        if start is None:
            return []
        out: list[StaticClass] = []
        seen: set[str] = set()

        def visit(c: StaticClass) -> None:
            if c.qualname in seen:
                return
            seen.add(c.qualname)
            out.append(c)
            mod = self.modules.get(c.file)
            for base in c.bases:
                found = None
                simple = base.rsplit(".", 1)[-1]
                if mod is not None and simple in mod.classes and mod.classes[simple] is not c:
                    found = mod.classes[simple]
                elif mod is not None and (origin := mod.imports.get(base.split(".")[0])):
                    full = origin + base[len(base.split(".")[0]):]
                    found = next(iter(self.find_classes(full)), None)
                if found is None:
                    found = next((x for x in self.find_classes(simple) if x is not c), None)
                if found is not None:
                    visit(found)

        visit(start)
        return out

    def submodules(self, name: str) -> dict[str, StaticSubmodule]:
        """Submodules of the class and of its indexed bases (the subclass wins)."""
        out: dict[str, StaticSubmodule] = {}
        for c in reversed(self.mro(name)):
            out.update(c.submodules)
        return out

    def forward_calls(self, name: str) -> list[StaticCall]:
        """Forward's calls, inherited forward and inherited helper methods followed through indexed bases."""
        chain = self.mro(name)
        if not chain:
            return []
        subs = self.submodules(name)

        def lookup(method: str) -> tuple[StaticMethod | None, str | None]:
            for c in chain:
                if method in c.methods:
                    return c.methods[method], (None if c.file == chain[0].file else c.file)
            return None, None

        return flatten_calls("forward", lookup, lambda n: n in subs)

    def find_forward_call(self, class_name: str, attr: str) -> StaticCall | None:
        for call in self.forward_calls(class_name):
            if call.receiver == "self" and call.name == attr:
                return call
        return None

    def find_forward_call_line(self, class_name: str, attr: str) -> int | None:
        """Line where forward (or a helper of the class it calls) calls ``self.<attr>(`` — the line to blame."""
        call = self.find_forward_call(class_name, attr)
        return call.line if call else None

    # ---- rendering
    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "modules": [m.to_json() for m in self.modules.values()],
                "unparsed": sorted(self._pending), "errors": self.errors}

    def render(self, names: Iterable[str] | None = None) -> str:
        if names is None:
            return "\n\n".join(m.render() for m in self.modules.values())
        return "\n".join(c.render() for n in names for c in self.find_classes(n))


def static_index_for_tree(tree: Any, *, on_error: str = "skip") -> StaticIndex:
    """A static index over the class files a dynamic :class:`~ekka_core.tree.ModelTree` names (``class_file`` of
    each module), ready for ``index.get_class(node.qualname)``. Files that cannot be parsed are recorded in
    ``index.errors`` (``on_error="skip"``)."""
    index = StaticIndex()
    index.on_error = on_error
    for node in getattr(tree, "modules", {}).values():
        file, qualname = getattr(node, "class_file", None), getattr(node, "qualname", "") or ""
        if file and Path(file).is_file():
            module = qualname.rpartition(".")[0] or None
            index.add_file(file, module)
    return index
