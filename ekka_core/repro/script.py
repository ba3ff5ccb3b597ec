"""A repro script as Ekka reads it: parsed with libcst (never run), its imports, the literal value of an expression
(following single name bindings, ``for`` loops, literal ``**`` splats), and why a value exists only at run time.

Anything whose value only exists when the script runs — an environment variable, a command-line argument, a file,
a list built in a loop — is :class:`Unresolved`; it becomes an :class:`Unknown` with its line, source snippet and a
hint. The reader never guesses a value.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider
from libcst.metadata.scope_provider import Assignment, ImportAssignment

from ekka_core.contracts.errors import BadInput

_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "sort",
             "reverse", "add", "discard", "__setitem__"}
_MAX_REPEAT = 10_000


@dataclass(frozen=True)
class Unknown:
    """A construct the importer found but could not turn into a value. ``field`` names the spec field it
    feeds (``model``, ``prompts``, ``messages``, ``dtype``, ``max_new_tokens``, ``target``, ``engine_args.<name>``)."""

    field: str
    line: int
    snippet: str
    reason: str
    hint: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.reason}: `{self.snippet}` — {self.hint}"


class Unresolved(Exception):
    """A value the script has only when it runs (or that Ekka does not evaluate), with the node to point at."""

    def __init__(self, node: cst.CSTNode, reason: str, hint: str = ""):
        super().__init__(reason)
        self.node, self.reason, self.hint = node, reason, hint


@dataclass
class Each:
    """A name bound by ``for NAME in ITER``: stands for each element of ITER in turn."""

    items: list[Any]
    loop: cst.For


class Script:
    """One parsed script: positions, parents and scopes (libcst metadata), what its imports name, the literal value
    of an expression (following name bindings), and what was found that has no value before the script runs."""

    def __init__(self, path: Path, module: cst.Module):
        self.path = path
        self.wrapper = MetadataWrapper(module)
        self.module = self.wrapper.module
        self.pos = self.wrapper.resolve(PositionProvider)
        self.parents = self.wrapper.resolve(ParentNodeProvider)
        self.scopes = self.wrapper.resolve(ScopeProvider)
        self.calls: list[cst.Call] = [n for n in self.pos if isinstance(n, cst.Call)]
        self.calls.sort(key=lambda n: (self.pos[n].start.line, self.pos[n].start.column))
        self._read_imports()
        self.unknown: list[Unknown] = []
        self.notes: list[str] = []

    @staticmethod
    def read(path: Path) -> "Script":
        """Parse ``path`` (never running it). BadInput for a file that is missing, unreadable or not Python."""
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
                msg = f"{msg} (Python itself accepts it: the syntax may be newer than libcst {libcst_version()})"
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
        return Script(path, module)

    # ------------------------------------------------------------------ helpers

    def line(self, node: cst.CSTNode) -> int:
        return self.pos[node].start.line

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def snippet(self, node: cst.CSTNode, limit: int = 100) -> str:
        text = " ".join(self.code(node).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def unknown_for(self, fld: str, err: Unresolved, hint: str) -> Unknown:
        full_hint = f"{err.hint}; {hint}" if err.hint else hint
        return Unknown(fld, self.line(err.node), self.snippet(err.node), err.reason, full_hint)

    def add_unknown(self, fld: str, err: Unresolved, hint: str) -> None:
        self.add(self.unknown_for(fld, err, hint))

    def add(self, u: Unknown) -> None:
        if u not in self.unknown:
            self.unknown.append(u)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _read_imports(self) -> None:
        """Which names are vLLM's LLM / SamplingParams / TokensPrompt, SGLang's Engine, and the vllm / sglang
        modules."""
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
            if func.value in ("LLM", "SamplingParams", "TokensPrompt", "TextPrompt"):  # pasted without the import
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

    def binding(self, name: cst.Name) -> cst.BaseExpression | Each:
        """The expression a name is bound to (single assignment, never mutated), or Each for a loop variable."""
        scope = self.scopes.get(name)
        if scope is None:
            raise Unresolved(name, f"`{name.value}` is not a name the script binds")
        assignments = [a for a in scope[name.value]]
        if not assignments:
            raise Unresolved(name, f"`{name.value}` is never assigned in the script",
                              "it is probably defined elsewhere")
        if len(assignments) > 1:
            lines = sorted({self.line(a.node) for a in assignments if isinstance(a, Assignment)})
            raise Unresolved(name, f"`{name.value}` is assigned {len(assignments)} times"
                              + (f" (lines {', '.join(map(str, lines))})" if lines else ""),
                              "which value is used depends on how the script runs")
        a = assignments[0]
        if isinstance(a, ImportAssignment):
            raise Unresolved(name, f"`{name.value}` is imported ({self.snippet(a.node)})",
                              "its value lives in another module")
        if not isinstance(a, Assignment):
            raise Unresolved(name, f"`{name.value}` is a Python builtin")
        for ref in a.references:
            self._check_mutation(name.value, ref.node)
        target = a.node
        parent = self.parents.get(target)
        if isinstance(parent, cst.AssignTarget):
            return self.parents[parent].value  # type: ignore[union-attr]
        if isinstance(parent, cst.AnnAssign) and parent.target is target and parent.value is not None:
            return parent.value
        if isinstance(parent, cst.For) and parent.target is target:
            return Each(self.iterable(parent.iter), parent)
        if isinstance(parent, cst.Element):
            tup = self.parents.get(parent)
            loop = self.parents.get(tup) if tup is not None else None
            if (isinstance(tup, cst.Tuple) and isinstance(loop, cst.For) and loop.target is tup
                    and len(tup.elements) == 2 and tup.elements[1] is parent and isinstance(loop.iter, cst.Call)
                    and isinstance(loop.iter.func, cst.Name) and loop.iter.func.value == "enumerate"
                    and len(loop.iter.args) == 1):
                return Each(self.iterable(loop.iter.args[0].value), loop)
        if isinstance(target, cst.Param) or isinstance(parent, cst.Param):
            raise Unresolved(target, f"`{name.value}` is a function parameter",
                              "its value depends on how the function is called")
        stmt = parent
        while stmt is not None and not isinstance(stmt, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            stmt = self.parents.get(stmt)
        where = self.snippet(stmt, 60) if stmt is not None else name.value
        raise Unresolved(target, f"`{name.value}` is bound at run time by `{where}`")

    def _check_mutation(self, name: str, ref: cst.CSTNode) -> None:
        parent = self.parents.get(ref)
        if isinstance(parent, cst.Attribute) and parent.value is ref and parent.attr.value in _MUTATORS:
            call = self.parents.get(parent)
            raise Unresolved(call if isinstance(call, cst.Call) else parent,
                              f"`{name}` is modified with .{parent.attr.value}(...)",
                              "its contents are only known when the script runs")
        if isinstance(parent, cst.Subscript) and parent.value is ref:
            holder = self.parents.get(parent)
            if isinstance(holder, (cst.AssignTarget, cst.Del)) or (isinstance(holder, cst.AugAssign)
                                                                   and holder.target is parent):
                if isinstance(holder, cst.AssignTarget):
                    holder = self.parents[holder]
                raise Unresolved(holder, f"`{name}` is modified by item assignment",
                                  "its contents are only known when the script runs")

    def deref(self, node: cst.BaseExpression, depth: int = 0) -> cst.BaseExpression | Each:
        """Follow name bindings to the expression they stand for."""
        while isinstance(node, cst.Name) and node.value not in ("True", "False", "None"):
            if depth > 50:
                raise Unresolved(node, f"`{node.value}` refers to itself")
            bound = self.binding(node)
            if isinstance(bound, Each):
                return bound
            node, depth = bound, depth + 1
        return node

    def iterable(self, node: cst.BaseExpression) -> list[Any]:
        value = self.value(node)
        if isinstance(value, str):
            raise Unresolved(node, "the loop iterates over the characters of a string")
        if not isinstance(value, list):
            raise Unresolved(node, "the loop does not iterate over a list")
        return value

    # ------------------------------------------------------------------ literal evaluation

    def value(self, node: cst.BaseExpression, depth: int = 0) -> Any:
        """The Python value of a literal expression (following name bindings), or Unresolved."""
        if depth > 100:
            raise Unresolved(node, "expression is too deeply nested")
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            return self._string(node)
        if isinstance(node, (cst.Integer, cst.Float)):
            return ast.literal_eval(node.value)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            v = self.value(node.expression, depth + 1)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return -v if isinstance(node.operator, cst.Minus) else v
            raise Unresolved(node, "unary operator on a non-number")
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.value]
            bound = self.deref(node)
            if isinstance(bound, Each):
                raise Unresolved(node, f"`{node.value}` is a loop variable (line {self.line(bound.loop)})",
                                  "it takes several values while the script runs")
            return self.value(bound, depth + 1)
        if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
            out: list[Any] = []
            for el in node.elements:
                if isinstance(el, cst.StarredElement):
                    out.extend(self._unpacked(el, list, depth))
                else:
                    out.append(self.value(el.value, depth + 1))
            return out
        if isinstance(node, cst.Dict):
            d: dict[Any, Any] = {}
            for el in node.elements:
                if isinstance(el, cst.StarredDictElement):
                    d.update(self._unpacked(el, dict, depth))
                else:
                    key = self.value(el.key, depth + 1)
                    if not isinstance(key, (str, int, float, bool)):
                        raise Unresolved(el.key, "dict key is not a string or number")
                    d[key] = self.value(el.value, depth + 1)
            return d
        if isinstance(node, cst.BinaryOperation):
            return self._binop(node, depth)
        if isinstance(node, cst.Subscript):
            return self._subscript(node, depth)
        if isinstance(node, cst.Call):
            return self._call(node, depth)
        if isinstance(node, cst.Attribute):
            raise self.runtime_error(node)
        if isinstance(node, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            raise Unresolved(node, "built by a comprehension when the script runs",
                              "write the resulting values out literally")
        if isinstance(node, cst.IfExp):
            raise Unresolved(node, "a conditional expression", "the branch taken is decided at run time")
        if isinstance(node, cst.Await):
            raise Unresolved(node, "the result of an `await`")
        raise Unresolved(node, f"not a literal ({type(node).__name__})")

    def _unpacked(self, el: cst.StarredElement | cst.StarredDictElement, kind: type, depth: int) -> Any:
        """The value a ``*x`` (a list) or ``**x`` (a dict) element unpacks."""
        inner = self.value(el.value, depth + 1)
        if not isinstance(inner, kind):
            raise Unresolved(el, "starred element is not a list" if kind is list
                             else "`**` of something that is not a dict")
        return inner

    def _string(self, node: cst.BaseExpression) -> str:
        for sub in string_parts(node):
            if isinstance(sub, cst.FormattedString) and any(
                    isinstance(p, cst.FormattedStringExpression) for p in sub.parts):
                raise Unresolved(node, "an f-string with substitutions", "its text is computed at run time")
        try:
            tree = ast.parse("(" + self.code(node) + ")", mode="eval").body
        except SyntaxError:  # pragma: no cover - libcst parsed it already
            raise Unresolved(node, "a string literal Ekka cannot read") from None
        text = ast_string(tree)
        if text is None:
            raise Unresolved(node, "bytes, not text")
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
                    raise Unresolved(node, f"repeats {n} times, too many to write into a spec")
                return seq * n
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
                return left * right
        if isinstance(node.operator, cst.Modulo) and isinstance(left, str):
            raise Unresolved(node, "a %-formatted string", "its text is computed at run time")
        raise Unresolved(node, "an operation Ekka does not evaluate", "write the value out literally")

    def _subscript(self, node: cst.Subscript, depth: int) -> Any:
        base_code = self.code(node.value)
        if base_code.endswith("environ"):
            raise self.runtime_error(node)
        if base_code.endswith("argv"):
            raise Unresolved(node, "a command-line argument (sys.argv)",
                              "its value is given when the script is started")
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            raise Unresolved(node, "a slice Ekka does not evaluate")
        base = self.value(node.value, depth + 1)
        idx = self.value(node.slice[0].slice.value, depth + 1)
        try:
            return base[idx]
        except (KeyError, IndexError, TypeError):
            raise Unresolved(node, f"index {idx!r} is not in the value") from None

    def keyword_args(self, node: cst.Call, depth: int = 0, *, what: str = "argument") -> dict[str, Any]:
        """The keyword arguments of a call as values, literal ``**`` splats included (``f(**{"a": 1}, b=2)``).
        A positional argument is Unresolved (``what`` names it); so is a value Ekka cannot evaluate."""
        d: dict[str, Any] = {}
        for a in node.args:
            if a.star == "**":
                inner = self.value(a.value, depth + 1)
                if not isinstance(inner, dict) or not all(isinstance(k, str) for k in inner):
                    raise Unresolved(a, "`**` of something that is not a dict of names")
                d.update(inner)
            elif a.star or a.keyword is None:
                raise Unresolved(a, f"positional {what}")
            else:
                d[a.keyword.value] = self.value(a.value, depth + 1)
        return d

    def _call(self, node: cst.Call, depth: int) -> Any:
        func = node.func
        if isinstance(func, cst.Name) and func.value == "dict" and all(
                a.keyword is not None or a.star == "**" for a in node.args):
            return self.keyword_args(node, depth)
        if self.qualname(func) in ("vllm.TokensPrompt", "vllm.TextPrompt"):
            # vLLM's prompt TypedDicts: the call is the dict of its keyword arguments
            return self.keyword_args(node, depth, what=f"{self.qualname(func)} argument")
        if isinstance(func, cst.Name) and func.value == "range" and 1 <= len(node.args) <= 3 \
                and not any(a.star or a.keyword for a in node.args):
            bounds = [self.value(a.value, depth + 1) for a in node.args]
            if all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) and bounds[-1:] != [0] \
                    and len(range(*bounds)) <= _MAX_REPEAT:
                return list(range(*bounds))
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
        raise self.runtime_error(node)

    def runtime_error(self, node: cst.BaseExpression) -> Unresolved:
        """Why a call / attribute has no value before the script runs, with a hint about where it comes from."""
        text = self.code(node)
        env = re.search(r"""(?:environ\s*\[|environ\.get\s*\(|getenv\s*\()\s*(['"])([^'"]+)\1""", text)
        if env or re.search(r"\b(environ|getenv)\b", text):
            var = env.group(2) if env else "?"
            default = self._env_default(node)
            return Unresolved(node, f"read from environment variable {var}",
                               f"the script's default is {default!r}" if default is not None
                               else "its value is only known when the script runs")
        if isinstance(node, cst.Attribute):
            hint = self._argparse_hint(node)
            if hint:
                return Unresolved(node, "a command-line argument", hint)
            return Unresolved(node, f"attribute `{text}` has a value only at run time")
        if re.search(r"\b(open|read_text|read|readlines|load|loads|load_dataset|read_csv|read_json)\s*\(", text):
            return Unresolved(node, "read from a file or data set when the script runs",
                               "paste the text it reads")
        if re.search(r"\binput\s*\(", text):
            return Unresolved(node, "typed in when the script runs")
        if re.search(r"\bparse_args\s*\(", text):
            return Unresolved(node, "command-line arguments")
        callee = self.code(node.func) if isinstance(node, cst.Call) else text
        return Unresolved(node, f"the result of calling `{' '.join(callee.split())}(...)` at run time")

    def _env_default(self, node: cst.BaseExpression) -> Any:
        if isinstance(node, cst.Call) and len(node.args) >= 2 and re.search(r"(environ\.get|getenv)$",
                                                                            self.code(node.func)):
            try:
                return self.value(node.args[1].value)
            except Unresolved:
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
                    except Unresolved:
                        pass
                elif a.keyword.value == "dest":
                    try:
                        dest = self.value(a.value)
                    except Unresolved:
                        pass
                elif a.keyword.value == "default":
                    try:
                        default, has_default = self.value(a.value), True
                    except Unresolved:
                        pass
            names = [f.lstrip("-").replace("-", "_") for f in flags if isinstance(f, str)]
            if dest == attr or (dest is None and attr in names):
                flag = next((f for f in flags if isinstance(f, str) and f.startswith("--")), flags[0] if flags
                            else attr)
                return (f"it comes from the command line ({flag}, line {self.line(call)}"
                        + (f", default {default!r} in the script)" if has_default else ")"))
        return None

    # ------------------------------------------------------------------ the engine

def string_parts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.ConcatenatedString):
        return string_parts(node.left) + string_parts(node.right)
    return [node]


def ast_string(tree: ast.expr) -> str | None:
    if isinstance(tree, ast.Constant):
        return tree.value if isinstance(tree.value, str) else None
    if isinstance(tree, ast.JoinedStr):
        parts = [ast_string(v) for v in tree.values]
        return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
    return None



def libcst_version() -> str:
    try:
        from importlib.metadata import version
        return version("libcst")
    except Exception:  # noqa: BLE001 - only used in a message
        return "(unknown version)"

