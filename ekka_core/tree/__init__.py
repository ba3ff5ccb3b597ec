"""Stage 2 — the Model Tree: every module a framework ran, with its class and where that class is defined.

Entry point: :func:`build_tree` (from a trace). ``render`` folds repeated layers (``layers.[0-31]``) into the
compact text an engineer or an agent reads.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ekka_core.sources import short_path

if TYPE_CHECKING:   # the tree is read by light processes (the language server): no torch at import time
    from ekka_core.capture.trace import Trace


@dataclass
class ModuleNode:
    name: str
    cls: str
    qualname: str
    class_file: str | None
    class_line: int | None
    forward_file: str | None
    forward_line: int | None
    calls: int = 0
    first_call: int = 0            # completion index of the first call: the execution order
    shared: bool = False           # one module object called from several places (vLLM's rotary_emb)
    registered: str | None = None  # for a shared module called here: the name it is registered under
    out_features: int | None = None


@dataclass
class ModelTree:
    framework: str
    modules: dict[str, ModuleNode] = field(default_factory=dict)   # in execution (first completion) order
    declared: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"framework": self.framework, "declared": self.declared,
                "modules": [asdict(m) for m in self.modules.values()]}

    def render(self) -> str:
        """One line per module, repeated layers folded: ``model.layers.[0-3].mlp  Gemma3MLP``."""
        folded: dict[tuple[str, str], list[int]] = {}
        first: dict[tuple[str, str], ModuleNode] = {}      # the node each folded line stands for
        for name, node in self.modules.items():
            m = re.search(r"\.(\d+)(\.|$)", name)
            key = (re.sub(r"\.(\d+)(\.|$)", r".#\2", name, count=1), node.cls) if m else (name, node.cls)
            folded.setdefault(key, []).append(int(m.group(1)) if m else -1)
            first.setdefault(key, node)
        lines = []
        for (pattern, cls), idx in folded.items():
            shown = pattern
            if "#" in pattern:
                shown = pattern.replace("#", f"[{min(idx)}-{max(idx)}]" if len(idx) > 1 else str(idx[0]))
            depth = shown.count(".")
            node = first[(pattern, cls)]
            where = f"  ({short_path(node.class_file)}:{node.class_line})" if node.class_file else ""
            lines.append(f"{'  ' * depth}{shown or '<root>'}  {cls}{where}")
        return "\n".join(lines)


def build_tree(trace: "Trace") -> ModelTree:
    from ekka_core.capture.trace import TensorRef

    tree = ModelTree(framework=trace.run.framework, declared=dict(trace.run.declared))
    shared_names: set[str] = set()
    for call in trace.calls:
        node = tree.modules.get(call.module)
        if node is None:
            first = next((o for o in call.outputs if isinstance(o, TensorRef)), None)
            node = ModuleNode(call.module, call.cls, call.qualname, call.class_file, call.class_line,
                              call.forward_file, call.forward_line, first_call=call.index,
                              out_features=first.shape[-1] if first and first.shape else None)
            tree.modules[call.module] = node
        node.calls += 1
        if call.shared_as:
            node.shared = True
            node.registered = call.shared_as
            shared_names.add(call.shared_as)
    for name in shared_names:
        if name in tree.modules:
            tree.modules[name].shared = True
    return tree


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
