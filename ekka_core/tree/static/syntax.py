"""Small helpers over libcst nodes shared by the parser and the call walker: dotted names, ``self.`` paths,
children in source order without libcst's visitor machinery, the statements of a block."""

from __future__ import annotations

import dataclasses
import re
from typing import Iterator, Sequence

import libcst as cst

BUILTINS = frozenset(dir(__import__("builtins")))
_LIST_MAKERS = {"ModuleList", "Sequential", "ModuleDict", "ParameterList"}
_LIST_MAKER_RE = re.compile(r"^make_(\w+_)?layers$")


def dotted(node: cst.CSTNode) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def self_path(node: cst.CSTNode) -> str | None:
    """``x.y`` for ``self.x.y``, ``self.x.y[...]`` and ``self.x[i].y`` (subscripts dropped); else None."""
    parts: list[str] = []
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name) and node.value == "self" and parts:
        return ".".join(reversed(parts))
    return None


def camel(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return bool(last) and last[0].isupper()


def is_list_maker(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last in _LIST_MAKERS or bool(_LIST_MAKER_RE.match(last))


_SKIP_FIELDS = frozenset({"lpar", "rpar", "comma", "semicolon", "leading_lines", "lines_after_decorators", "header",
                          "footer", "indent", "trailing_whitespace", "equal", "dot", "colon", "asynchronous",
                          "newline", "relative"})
_FIELDS: dict[type, tuple[str, ...]] = {}


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
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


def descendants(node: cst.CSTNode, prune: tuple[type, ...] = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
                 ) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (pre-order), not descending into nested ``prune`` nodes."""
    stack = list(children(node))
    stack.reverse()
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, prune):
            kids = list(children(n))
            kids.reverse()
            stack.extend(kids)


def suites(stmt: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The blocks a compound statement holds (not a nested def's or class's)."""
    if isinstance(stmt, cst.If):
        yield stmt.body
        if isinstance(stmt.orelse, cst.If):
            yield from suites(stmt.orelse)
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


def statements(body: Sequence[cst.CSTNode], *, into_defs: bool = False) -> Iterator[cst.CSTNode]:
    """Statements of a block in source order, small statements (``x = 1``, ``import y``) included, descending into
    compound statements (and into nested defs/classes only with ``into_defs``)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            yield from stmt.body
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            if into_defs:
                yield from statements(stmt.body.body, into_defs=True)
        else:
            for suite in suites(stmt):
                yield from statements(suite.body, into_defs=into_defs)
