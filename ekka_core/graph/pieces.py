"""Split a Dynamo FX graph into pieces along module boundaries, taken from each node's ``nn_module_stack``.

A piece is a *contiguous run* of nodes traced from one module call at the chosen depth: the graph's node order is
topological, so contiguous runs can never form a cycle between pieces, and a module called twice (or a shared one,
such as a rotary embedding used by every layer) gives two pieces, one per call. Nodes without a module stack (glue
between module calls: masks, residual adds in a model's own ``forward``) join the run before them.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.passes.split_module import split_module

from ekka_core.contracts.graph import NodeSource

# Dynamo names the traced root ``L['self']`` (and, for a function's module argument, ``L['name']``).
_ROOT = re.compile(r"^L\['[^']*'\]\.?")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n(?P<code>[^\n]*)')


@dataclass
class Piece:
    index: int
    module: str                 # module path at the split depth ("layers.1", "layers.1.mlp"; "" for the root)
    module_class: str | None
    graph: fx.GraphModule       # the piece alone: its inputs are the values the previous pieces computed
    submodule: str              # its name in the split graph


@dataclass
class SplitGraph:
    graph: fx.GraphModule       # calls the pieces in order
    pieces: list[Piece]


def module_path(node: fx.Node) -> tuple[str, str | None] | None:
    """The innermost module a node was traced from, as a dotted path from the traced root, and its class name."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", None)
    return _ROOT.sub("", str(path)), (name.rsplit(".", 1)[-1] if name else None)


def cut(path: str, depth: int, within: str = "") -> str:
    """The path cut ``depth`` segments below ``within`` (or below the first numbered segment — a decoder layer's
    index — when ``within`` is empty): ``cut("layers.1.mlp.up_proj", 0) == "layers.1"``, ``… 1) == "layers.1.mlp"``."""
    parts = path.split(".") if path else []
    if within:
        base = len(within.split("."))
        if path != within and not path.startswith(within + "."):
            return path
        return ".".join(parts[:base + depth])
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1 + depth])
    return ".".join(parts[:1 + depth]) if depth >= 0 else path


def node_source(node: fx.Node) -> NodeSource:
    """The node and its innermost traced source line."""
    frames = list(_FRAME.finditer(node.meta.get("stack_trace") or ""))
    last = frames[-1] if frames else None
    found = module_path(node)
    return NodeSource(node=node.name, op=_op_name(node.target), file=last["file"] if last else None,
                      line=int(last["line"]) if last else None, code=last["code"].strip() if last else None,
                      module=found[0] if found else None)


def _op_name(target: object) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)


def split_by_module(gm: fx.GraphModule, key: Callable[[fx.Node], str | None]) -> SplitGraph:
    """Split ``gm`` into contiguous runs of equal ``key(node)`` (None: the run continues)."""
    runs: dict[fx.Node, int] = {}
    labels: list[list] = []            # [module path, class of the module at that path (if a node names it)]
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        k = key(node)
        if k is not None and (not labels or k != labels[-1][0]):
            labels.append([k, None])
        elif not labels:
            labels.append(["", None])
        found = module_path(node)
        if labels[-1][1] is None and found and found[0] == labels[-1][0]:
            labels[-1][1] = found[1]
        runs[node] = len(labels) - 1
    split = split_module(gm, None, lambda n: runs[n], keep_original_order=True, keep_original_node_name=True,
                         tuple_return=True)
    pieces = []
    for i, (module, cls) in enumerate(labels):
        name = f"submod_{i}"
        sub = getattr(split, name, None)
        if isinstance(sub, fx.GraphModule):
            pieces.append(Piece(index=len(pieces), module=module, module_class=cls, graph=sub, submodule=name))
    return SplitGraph(graph=split, pieces=pieces)


def by_module(depth: int, within: str = "") -> Callable[[fx.Node], str | None]:
    """The split key: each node's module path cut at ``depth`` (see :func:`cut`); nodes outside ``within`` keep
    their own cut at the top level so that a sub-split of one piece still names every node."""
    def key(node: fx.Node) -> str | None:
        found = module_path(node)
        return None if found is None else cut(found[0], depth, within)
    return key


def by_node() -> Callable[[fx.Node], str | None]:
    """The split key that makes every computing node a piece of its own (views and getitems join the node before)."""
    def key(node: fx.Node) -> str | None:
        if node.op == "get_attr" or node.target in (getattr, operator.getitem):
            return None
        return node.name
    return key


def floating(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()
