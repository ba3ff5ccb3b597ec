"""Name the compiler stage that introduces a departure: compile the suspect piece again with one stage removed at a
time, and keep every removal that brings it back within noise.

The stages, in the order a compiled graph meets them: a custom pre-grad pass; each decomposition Inductor applies
to an aten op of the piece; the custom post-grad pass — and, when it is a pass manager (vLLM's
``PostGradPassManager`` keeps its passes in ``.passes``), each of its passes; Inductor's own pattern-matcher
rewrites and epilogue fusion.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ekka_core.graph.replay import Compile, inductor


@dataclass
class Toggle:
    stage: str
    name: str
    compile_piece: Compile
    words: str
    around: Callable[[], Any] | None = None       # a context manager to hold while compiling and running


def piece_aten_ops(gm: fx.GraphModule, inputs: list[Any]) -> list[Any]:
    """The aten ops the piece dispatches to, in first-use order (traced without decompositions)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        traced = make_fx(gm, tracing_mode="real")(*inputs)
    ops: list[Any] = []
    for node in traced.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target not in ops:
            ops.append(node.target)
    return ops


def toggles(gm: fx.GraphModule, inputs: list[Any], config_patches: dict[str, Any] | None) -> list[Toggle]:
    """Every stage removal worth one compile of this piece."""
    import torch._inductor.config as inductor_config
    from torch._inductor.decomposition import select_decomp_table

    patches = dict(config_patches or {})
    found: list[Toggle] = []
    pre = patches.get("pre_grad_custom_pass", inductor_config.pre_grad_custom_pass)
    if pre is not None:
        found.append(Toggle("pre-grad pass", _pass_name(pre), inductor({**patches, "pre_grad_custom_pass": None}),
                            f"with the custom pre-grad pass {_pass_name(pre)} off"))
    table = select_decomp_table()
    for op in piece_aten_ops(gm, inputs):
        if op in table:
            without = {k: v for k, v in table.items() if k != op}
            found.append(Toggle("decomposition", str(op), inductor(patches, decompositions=without),
                                f"with Inductor's decomposition of {op} removed (the op lowered or run as aten)",
                                around=_without_torch_ci_lint))
    post = patches.get("post_grad_custom_post_pass", inductor_config.post_grad_custom_post_pass)
    if post is not None:
        members = list(getattr(post, "passes", []) or [])
        for member in members:
            found.append(Toggle("post-grad pass", _pass_name(member), inductor(patches),
                                f"with the post-grad pass {_pass_name(member)} off",
                                around=lambda m=member, p=post: _without_member(p, m)))
        found.append(Toggle("post-grad pass", _pass_name(post),
                            inductor({**patches, "post_grad_custom_post_pass": None}),
                            f"with the custom post-grad pass {_pass_name(post)} off"))
    for flag in ("pattern_matcher", "epilogue_fusion"):
        found.append(Toggle("inductor config", flag, inductor({**patches, flag: False}),
                            f"with Inductor's {flag} off"))
    return found


def _pass_name(p: Any) -> str:
    """A pass's own name (vLLM's passes carry ``pass_name``), a function's name, or its class's."""
    if getattr(p, "pass_name", None):
        return str(p.pass_name)
    return p.__name__ if isinstance(p, types.FunctionType) else type(p).__name__


@contextmanager
def _without_torch_ci_lint() -> Iterator[None]:
    """Inductor, when ``CI`` is set, refuses to fall back to aten for an op that has a decomposition ("make_fallback
    …: a decomposition exists, we should switch to it") — a lint for torch's own CI. Taking one decomposition away
    on purpose needs exactly that fallback, so ``CI`` is hidden from Inductor for that one compile."""
    saved = os.environ.pop("CI", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["CI"] = saved


@contextmanager
def _without_member(manager: Any, member: Any) -> Iterator[None]:
    """The pass manager with one pass taken out, for one compile."""
    kept = manager.passes
    manager.passes = [p for p in kept if p is not member]
    try:
        yield
    finally:
        manager.passes = kept


class _Recording:
    """Wraps a post-grad pass: runs it and keeps the nodes it rewired or made, with their source lines."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.touched = inner, []

    def __call__(self, graph: fx.Graph) -> None:
        before = {n: (n.target, repr(n.args), repr(n.kwargs)) for n in graph.nodes}
        self.inner(graph)
        for n in graph.nodes:
            if n.op == "call_function" and before.get(n) != (n.target, repr(n.args), repr(n.kwargs)):
                self.touched.append(n)

    def uuid(self) -> Any:
        return getattr(self.inner, "uuid", lambda: None)()


def rewritten_nodes(gm: fx.GraphModule, inputs: list[Any], config_patches: dict[str, Any] | None,
                    finding_name: str) -> list[fx.Node]:
    """The post-grad nodes the named pass rewired or made when the piece is compiled as the engine compiles it."""
    import torch._inductor.config as inductor_config

    patches = dict(config_patches or {})
    post = patches.get("post_grad_custom_post_pass", inductor_config.post_grad_custom_post_pass)
    if post is None:
        return []
    members = list(getattr(post, "passes", []) or [])
    target = next((m for m in members if _pass_name(m) == finding_name), None)
    if target is not None:
        recorder = _Recording(target)
        kept = post.passes
        post.passes = [recorder if p is target else p for p in kept]
        try:
            inductor(patches)(gm, inputs)
        finally:
            post.passes = kept
    elif _pass_name(post) == finding_name:
        recorder = _Recording(post)
        inductor({**patches, "post_grad_custom_post_pass": recorder})(gm, inputs)
    else:
        return []
    return recorder.touched
