"""Source lines of a tree's modules, found by parsing the parent classes statically (libcst, no import): the line
that calls a module (:func:`call_site`) and the span of ``forward`` between two children (:func:`forward_span`)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ekka_core.tree.model_tree import ModelTree


def call_site(tree: ModelTree, module: str) -> tuple[str, int] | None:
    """The line in the parent's ``forward`` that calls ``module`` (``self.<attr>(…)``), found by parsing the
    parent class's source statically (libcst, no import): where an engine developer puts the breakpoint."""
    if "." not in module:
        return None
    parent_name, attr = module.rsplit(".", 1)
    parent = tree.modules.get(parent_name)
    if parent is None or not parent.class_file or not Path(parent.class_file).is_file():
        return None
    line = _static_index(parent.class_file, parent.qualname.rpartition(".")[0]).find_forward_call_line(parent.cls, attr)
    return (parent.class_file, line) if line else None


@functools.lru_cache(maxsize=64)
def _static_index(file: str, module: str) -> Any:
    """One parse per source file per process: suspects often share a parent class file."""
    from ekka_core.tree.static import StaticIndex

    index = StaticIndex()
    index.on_error = "skip"
    index.add_file(file, module or None)
    return index


def forward_span(cls: str, qualname: str, class_file: str | None, child_from: str, child_to: str
                 ) -> tuple[str, int, int] | None:
    """Where the ``forward`` of class ``cls`` (defined in ``class_file``) runs code between calling its child
    ``child_from`` (``""``: the start of forward) and its child ``child_to``: (file, line of the first call, line of
    the second). A child called from a helper method counts at the line forward calls that helper; a ModuleList
    child (``layers``) at the line that calls its elements (``for layer in self.layers: layer(…)``)."""
    if not class_file or not Path(class_file).is_file():
        return None
    index = _static_index(class_file, qualname.rpartition(".")[0])
    calls = list(index.forward_calls(cls))
    forward_line = next((c.forward_line for c in index.find_classes(cls) if c.forward_line), None)

    def line_of(child: str) -> int | None:
        for i, call in enumerate(calls):
            if call.receiver == "self" and call.name.split(".", 1)[0] == child:
                if call.via is None:
                    return call.line
                helper = next((c for c in reversed(calls[:i]) if c.kind == "method" and c.name == call.via
                               and c.via is None), None)
                return helper.line if helper else call.line
        return None

    start = line_of(child_from) if child_from else forward_line
    end = line_of(child_to)
    if start is None or end is None or end < start:
        return None
    return class_file, start, end
