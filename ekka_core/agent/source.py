"""Class source for ``get_class_definition``, never importing the code.

First choice: the libcst static index (:class:`ekka_core.tree.static.StaticIndex`, lazy, over the class files the
Model Tree names). Fallback, when the static index is unavailable or cannot parse the file: :mod:`ast` over the
file recorded in the tree node (``class_file`` / ``class_line``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from ekka_core.agent.tensors import ToolError
from ekka_core.tree import ModelTree


class SourceLookup:
    def __init__(self, tree: ModelTree):
        self.tree = tree
        self._index: Any = None
        self._index_failed = False

    def files(self) -> list[str]:
        return list(dict.fromkeys(n.class_file for n in self.tree.modules.values()
                                  if n.class_file and Path(n.class_file).is_file()))

    def _static(self) -> Any:
        if self._index is None and not self._index_failed:
            try:
                from ekka_core.tree.static import StaticIndex
                self._index = StaticIndex.from_tree(self.tree, lazy=True)
            except Exception:                       # no libcst, or an older static module: use ast
                self._index_failed = True
        return self._index

    def class_source(self, class_name: str) -> str:
        simple = class_name.rpartition(".")[2]
        nodes = [n for n in self.tree.modules.values() if n.cls == simple or n.qualname == class_name]
        node = nodes[0] if nodes else None
        header = ""
        if node is not None:
            header = f"# {node.qualname} — {node.class_file}:{node.class_line}\n"
            header += f"# modules of this class: {', '.join(n.name or '<root>' for n in nodes[:8])}" \
                      f"{' …' if len(nodes) > 8 else ''}\n"
        index = self._static()
        if index is not None:
            for name in ((node.qualname, simple) if node is not None else (simple,)):
                try:
                    return header + index.class_source(name)
                except Exception:
                    continue
        candidates = [node.class_file] if node is not None and node.class_file else self.files()
        for file in candidates:
            src = _ast_class_source(file, simple, node.class_line if node is not None else None)
            if src is not None:
                return header + src
        classes = sorted({n.cls for n in self.tree.modules.values()})
        if node is None:
            raise ToolError(f"no class {class_name!r} among the {self.tree.framework} tree's modules or in their "
                            f"source files; classes in the tree: {', '.join(classes[:60])}")
        raise ToolError(f"the source of {class_name} is not available ({node.class_file or 'no file recorded'}"
                        f"{'' if node.class_file and Path(node.class_file).is_file() else ' does not exist here'})")


def _ast_class_source(file: str | None, name: str, line: int | None) -> str | None:
    if not file or not Path(file).is_file():
        return None
    try:
        text = Path(file).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    if not found:
        return None
    if line is not None:
        found.sort(key=lambda n: abs(n.lineno - line))
    cls = found[0]
    start = min([cls.lineno] + [d.lineno for d in cls.decorator_list])
    lines = text.splitlines()
    return "\n".join(lines[start - 1:cls.end_lineno or start]) + "\n"
