"""The dynamic Model Tree: every module a framework ran, in execution order, with its class and where that class is
defined — built from a trace (:func:`build_tree`) and rendered with repeated layers folded."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
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
    in_features: int | None = None   # width of the first floating-point input (what the module consumes)
    # The modules owning the parameters this one computes with (see RunInfo.module_weights), in this framework's
    # names; None when the trace did not record them.
    weights: list[str] | None = None
    # What its output is beyond its last weighted child's output, observed on its first call (observe_added_input):
    # -1 nothing (it returns that child's output), k its float input #k added (a residual added inside the block),
    # None not observed or neither.
    adds_input: int | None = None


@dataclass
class ModelTree:
    framework: str
    modules: dict[str, ModuleNode] = field(default_factory=dict)   # in execution (first completion) order
    declared: dict[str, Any] = field(default_factory=dict)
    tp_size: int = 1     # a tensor-parallel trace, unsharded: outputs are whole, some inputs are still slices
    weight_sums: dict[str, list[float]] = field(default_factory=dict)   # per owner: RunInfo.weight_sums

    def fingerprint(self, node: ModuleNode) -> tuple[float, float] | None:
        """(Σw, Σw²) over every weight ``node`` computes with, or None when not recorded or parameter-free."""
        # An owner whose values sum to nothing was not observable (an engine that repacked it after loading).
        if not node.weights or any(o not in self.weight_sums or not self.weight_sums[o][1] > 0 for o in node.weights):
            return None
        return (sum(self.weight_sums[o][0] for o in node.weights), sum(self.weight_sums[o][1] for o in node.weights))

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

    tree = ModelTree(framework=trace.run.framework, declared=dict(trace.run.declared), tp_size=trace.run.tp_size,
                     weight_sums=dict(trace.run.weight_sums))
    shared_names: set[str] = set()
    weights = trace.run.module_weights
    for call in trace.calls:
        node = tree.modules.get(call.module)
        if node is None:
            first = next((o for o in call.outputs if isinstance(o, TensorRef)), None)
            consumed = next((i for i in call.inputs if isinstance(i, TensorRef) and i.is_float), None)
            node = ModuleNode(call.module, call.cls, call.qualname, call.class_file, call.class_line,
                              call.forward_file, call.forward_line, first_call=call.index,
                              out_features=first.shape[-1] if first and first.shape else None,
                              in_features=consumed.shape[-1] if consumed and consumed.shape else None,
                              weights=weights.get(call.shared_as or call.module) if weights is not None else None)
            tree.modules[call.module] = node
        node.calls += 1
        if call.shared_as:
            node.shared = True
            node.registered = call.shared_as
            shared_names.add(call.shared_as)
    for name in shared_names:
        if name in tree.modules:
            tree.modules[name].shared = True
    for node in tree.modules.values():
        node.adds_input = observe_added_input(tree, trace, node)
    return tree


# Relative distance under which two tensors of one trace are the same sum: a bf16 add rounds each element by at most
# 2^-8 of it; adding a residual (or not) moves the output by the residual's whole size.
_SAME_SUM = 2.0 ** -6


def observe_added_input(tree: ModelTree, trace: "Trace", node: ModuleNode) -> int | None:
    """What ``node``'s first call returns beyond its last weighted child's output, read off the trace's own tensors
    (see :attr:`ModuleNode.adds_input`). Only for a module holding weights through children, returning one tensor
    of its child's shape: HF's BLOOM attention and MLP return ``dropout_add(out, residual)``, vLLM's return ``out``
    and add the residual in the decoder layer — the same weights, not the same function."""
    from ekka_core.capture.trace import TensorRef

    if not node.name or not node.weights or node.name in node.weights:
        return None
    children = [c for n, c in tree.modules.items()
                if n.startswith(node.name + ".") and "." not in n[len(node.name) + 1:] and c.weights
                and c.first_call < node.first_call]
    if not children:
        return None
    last = max(children, key=lambda c: c.first_call)
    call = next(iter(trace.calls_of(node.name)), None)
    child_call = next(iter(trace.calls_of(last.name)), None)
    if call is None or child_call is None or call.step != child_call.step:
        return None
    out = next((o for o in call.outputs if isinstance(o, TensorRef) and o.is_float), None)
    child = next((o for o in child_call.outputs if isinstance(o, TensorRef) and o.is_float), None)
    if out is None or child is None or out.shape != child.shape:
        return None
    y, c = trace.tensor(out).float(), trace.tensor(child).float()
    size = float(y.norm()) or 1.0
    if float((y - c).norm()) <= _SAME_SUM * size:
        return -1
    inputs = [i for i in call.inputs if isinstance(i, TensorRef) and i.is_float]
    for k, ref in enumerate(inputs):
        if ref.shape == out.shape and float((y - c - trace.tensor(ref).float()).norm()) <= _SAME_SUM * size:
            return k
    return None
