"""Line numbers of the nodes the static parse needs, fast.

libcst's public ``PositionProvider`` (``MetadataWrapper.resolve``) computes a full position for every node and runs an
extra visitor pass; measured on 60 vLLM model files (libcst 1.9, 2 shared cores) it took 16.9 s against 3.3 s for this
lean pass (parsing them: 8.6 s), so a whole diagnosis' static parse would cost about twice as much. The lean pass runs
libcst's code generator with a state that only counts newlines and records start lines for the node types used here
— the same syntactic start lines as ``PositionProvider`` (``tests/tree`` compares the two on real files). It relies
on libcst's code generator internals (``CodegenState``, ``Module._codegen``), which is why ``pyproject.toml`` pins
libcst to the tested range; should they ever be missing, :func:`line_table` falls back to ``PositionProvider``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

try:  # private: see the module docstring
    from libcst._nodes.internal import CodegenState
except ImportError:  # pragma: no cover - a libcst outside the pinned range
    CodegenState = None  # type: ignore[assignment,misc]

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
class _LineState(CodegenState if CodegenState is not None else object):  # type: ignore[misc]
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


def line_table(module: cst.Module, *, lean: bool | None = None) -> dict[cst.CSTNode, tuple[int, int]]:
    """``(start_line, line_after)`` per class, def, decorator, call, assignment, for, return and lambda node.

    ``start_line`` is ``PositionProvider``'s ``start.line`` (the syntactic start: ``class``/``def`` keyword, a call's
    first token). ``line_after`` is the line the code generator is on when the node is done; for a ``class``/``def``
    whose body ends with a newline that is the line after its last line. ``lean=False`` forces the public
    ``PositionProvider`` (what happens by itself when libcst lacks the internals the lean pass uses)."""
    if lean is False or (lean is None and not LEAN):
        return _public_line_table(module)
    nl = "\r" if module.default_newline == "\r" else "\n"
    state = _LineState(default_indent=module.default_indent, default_newline=module.default_newline, newline=nl)
    module._codegen(state)
    return state.table


LEAN = CodegenState is not None and hasattr(cst.Module, "_codegen")
_COMPOUND = (cst.ClassDef, cst.FunctionDef, cst.For)


def _public_line_table(module: cst.Module) -> dict[cst.CSTNode, tuple[int, int]]:
    """The same table from libcst's public PositionProvider (several times slower)."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    table: dict[cst.CSTNode, tuple[int, int]] = {}
    for node, pos in positions.items():
        if isinstance(node, _WANTED):
            # the lean pass is past a compound statement's last newline (on the line after it), and on the last
            # line of anything else
            after = pos.end.line + 1 if isinstance(node, _COMPOUND) else pos.end.line
            table[node] = (pos.start.line, after)
    return table
