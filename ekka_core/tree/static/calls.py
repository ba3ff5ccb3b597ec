"""The calls a method body makes, in call-start order, and ``forward``'s calls with the class's own helper methods
inlined (:func:`flatten_calls`): the order the static tree joins with the traced call order."""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable, Protocol

import libcst as cst

from ekka_core.tree.static.model import StaticCall, StaticClass, StaticMethod
from ekka_core.tree.static.syntax import BUILTINS, children, dotted, self_path


class FileScope(Protocol):
    """What the walker needs of the file being parsed (the parser)."""

    imports: dict[str, str]
    globals_defined: set[str]

    def line(self, node: cst.CSTNode) -> int: ...


class CallWalker:
    """Calls of one method body in call-start order (func sub-expressions, then arguments, then the call)."""

    def __init__(self, parser: FileScope, cls: StaticClass):
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
        elif isinstance(node, (cst.For, cst.While)):
            if isinstance(node, cst.For):
                w(node.iter, cond, loop)
                self.bind_loop(node.target, node.iter)
            else:
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
                src = self_path(node.value)
                name = node.targets[0].target.value
                if src is not None and src.split(".")[0] in self.cls.submodules:
                    self.aliases[name] = src
                else:
                    self.aliases.pop(name, None)
        else:
            for child in children(node):
                w(child, cond, loop)

    def bind_loop(self, target: cst.CSTNode, it: cst.CSTNode) -> None:
        attrs: list[str] = []
        stack = [it]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Attribute) and (p := self_path(node)) is not None:
                attrs.append(p)
                continue
            stack.extend(reversed(list(children(node))))
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
            elif name not in BUILTINS or name in self.p.imports or name in self.p.globals_defined:
                record = StaticCall(name, None, line, "function")
        else:
            # the callee's own sub-expressions run first: ``self.q_proj(h).view(...)`` calls q_proj, then view
            if isinstance(func, cst.Attribute):
                self.walk(func.value, cond, loop)
            else:
                self.walk(func, cond, loop)
            if (path := self_path(func)) is not None:
                record = StaticCall(path, "self", line, "self")
            elif isinstance(func, cst.Attribute) and (d := dotted(func)) is not None:
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
