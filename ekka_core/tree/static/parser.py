"""Parse one model source file with libcst (never importing it): classes, their literal attributes, the submodules
``__init__`` (and the helpers it calls) assigns, every method's calls (:mod:`.calls`)."""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import libcst as cst

from ekka_core.contracts.errors import BadInput
from ekka_core.tree.static.calls import CallWalker, flatten_calls
from ekka_core.tree.static.lines import line_table
from ekka_core.tree.static.locate import module_name_for
from ekka_core.tree.static.model import StaticAttribute, StaticClass, StaticMethod, StaticModule, StaticSubmodule
from ekka_core.tree.static.syntax import (BUILTINS, camel, descendants, dotted, is_list_maker, self_path,
                                          statements)

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
        for node in statements(self.tree.body, into_defs=True):
            if isinstance(node, cst.Import):
                for alias in node.names:
                    full = dotted(alias.name) or ""
                    local = alias.asname.name.value if alias.asname else full.split(".")[0]
                    self.imports.setdefault(local, full if alias.asname else full.split(".")[0])
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                base = dotted(node.module) if node.module is not None else ""
                dots = len(node.relative)
                if dots:
                    if package is None:
                        base = "." * dots + (base or "")
                    else:
                        parts = package.split(".")
                        parts = parts[:len(parts) - (dots - 1)]
                        base = ".".join([*parts, *([base] if base else [])])
                for alias in node.names:
                    name = dotted(alias.name) or ""
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
            bases=[dotted(a.value) or self.code(a.value).strip() for a in node.bases],
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
        if isinstance(node, cst.Call) and (callee := dotted(node.func)) is not None and allow_ref:
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
        if allow_ref and (ref := dotted(node)) is not None:
            return "ref", ref
        return None

    def _local_literals(self, cls: StaticClass, fn: cst.FunctionDef) -> None:
        """``*mapping*`` locals in any method and literal ``self.x = …`` in ``__init__``."""
        for node in statements(fn.body.body):
            if not isinstance(node, cst.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0].target
            if isinstance(target, cst.Name) and "mapping" in target.value.lower():
                ok, value = self._literal(node.value)
                if ok:
                    cls.attributes.append(StaticAttribute(target.value, value, self.line(node), "local",
                                                          "literal", fn.name.value))
            elif (fn.name.value == "__init__" and isinstance(target, cst.Attribute)
                  and (path := self_path(target)) and "." not in path):
                ok, value = self._literal(node.value)
                if ok:
                    cls.attributes.append(StaticAttribute(path, value, self.line(node), "instance",
                                                          "literal", "__init__"))

    # ---- submodules
    @staticmethod
    def _self_method_calls(fn: cst.FunctionDef, funcs: dict[str, cst.FunctionDef]) -> list[str]:
        found: list[str] = []
        for node in descendants(fn.body):
            if isinstance(node, cst.Call):
                p = self_path(node.func)
                if p and p in funcs and p not in found:
                    found.append(p)
        return found

    @staticmethod
    def _kind_of(ctor: str) -> str:
        last = ctor.rsplit(".", 1)[-1]
        if last in ("Parameter", "Buffer", "UninitializedParameter", "UninitializedBuffer"):
            return "parameter"
        return "list" if is_list_maker(ctor) else "class" if camel(ctor) else "factory"

    def _locals_of(self, fn: cst.FunctionDef) -> dict[str, list[cst.CSTNode]]:
        """Local name → the expressions assigned to it (and a parameter's default)."""
        out: dict[str, list[cst.CSTNode]] = {}
        params = fn.params
        for p in [*params.posonly_params, *params.params, *params.kwonly_params]:
            if p.default is not None:
                out.setdefault(p.name.value, []).append(p.default)
        for node in statements(fn.body.body):
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
            elif (d := dotted(expr)) is not None:
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
                return dotted(expr.func)
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

        for node in statements(fn.body.body):
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    target = t.target
                    if isinstance(target, (cst.Tuple, cst.List)):
                        names = [self_path(e.value) if isinstance(e.value, cst.Attribute) else None
                                 for e in target.elements]
                        if names and all(names) and not any("." in n for n in names):
                            record(names, node.value, self.line(node))
                    elif isinstance(target, cst.Attribute) and (p := self_path(target)) and "." not in p:
                        record([p], node.value, self.line(node))
            elif isinstance(node, cst.AnnAssign) and node.value is not None and isinstance(node.target, cst.Attribute):
                if (p := self_path(node.target)) and "." not in p:
                    record([p], node.value, self.line(node))

    def _submodule_for(self, names: list[str], value: cst.CSTNode, line: int, method: str,
                       local: dict[str, list[cst.CSTNode]], funcs: dict[str, cst.FunctionDef]
                       ) -> StaticSubmodule | None:
        if isinstance(value, cst.Call):
            callee = dotted(value.func)
            if callee is None:
                return None
            if len(names) > 1:
                # ``self.start, self.end, self.layers = make_layers(...)``: the list goes to the one name that is
                # not a start/end index (or the one ending in ``layers``).
                if not is_list_maker(callee):
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
            if callee in BUILTINS and callee not in self.imports and callee not in self.globals_defined:
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
        if len(names) == 1 and (path := self_path(value)) is not None and isinstance(value, cst.Attribute):
            return StaticSubmodule(names[0], path, line, "alias", method)
        return None

    # ---- calls
    def _method(self, fn: cst.FunctionDef, cls: StaticClass) -> StaticMethod:
        start, after = self.lines[fn]
        params = [p.name.value for p in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]]
        walker = CallWalker(self, cls)
        walker.walk(fn.body, False, False)
        returns = [d for node in statements(fn.body.body)
                   if isinstance(node, cst.Return) and isinstance(node.value, cst.Call)
                   and (d := dotted(node.value.func))]
        return StaticMethod(fn.name.value, start, after - 1, params, walker.calls, returns)




def parse_module_source(path: str | Path, module: str | None = None) -> StaticModule:
    """Parse one Python file with libcst (never imports it). ``module``: its dotted name, derived from the
    ``__init__.py`` chain above it when omitted. A syntax error raises :class:`BadInput` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"no such source file: {p}", fix="pass the path of a Python file")
    return _Parser(p, module if module is not None else module_name_for(p)).run()
