"""Run one piece three ways on the inputs the eager graph fed it: eagerly in its own dtype, eagerly in wider
precision (the truth), and compiled by Inductor as the engine compiles it — and score compiled against eager with the error ratio.

Feeding every piece the *eager* graph's values (not the compiled pieces' outputs) is what isolates it: a piece is
judged on what it does to correct inputs, so a departure cannot be inherited from an earlier piece.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from ekka_core.analysis import error_ratio
from ekka_core.contracts.ranking import finite_ratio
from ekka_core.graph.pieces import SplitGraph, floating

class NotComparable(Exception):
    """A piece that cannot be scored: the reason is its message."""


Compile = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]
_LOW_PRECISION = (torch.bfloat16, torch.float16, torch.float32)


def piece_inputs(split: SplitGraph, example_inputs: Sequence[Any]) -> dict[str, list[Any]]:
    """Each piece's arguments when the split graph runs eagerly on ``example_inputs``."""
    seen: dict[str, list[Any]] = {}

    class Recorder(fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            if isinstance(target, str) and target.startswith("submod_"):
                seen[target] = fresh(args)      # as they were: the piece may write into them (an in-place op)
            return super().call_module(target, args, kwargs)

    with torch.no_grad():
        Recorder(split.graph).run(*example_inputs)
    return seen


def fresh(values: Sequence[Any]) -> list[Any]:
    """Each run of a piece gets its own copy of every tensor that is not a parameter: a piece that writes into an
    input (an in-place op, an output buffer it was handed) must not hand the next run other values than the first
    one got — eager, compiled and the twin are compared on the same inputs, or not at all."""
    return [v.clone() if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) else v for v in values]


def truth_dtype(dtype: str) -> torch.dtype:
    """The precision of the truth: float32 for a bf16/fp16 piece (as everywhere in Ekka: some kernels, e.g. MoE's
    grouped GEMM, take no float64), float64 for a float32 one."""
    return torch.float64 if dtype.removeprefix("torch.") == "float32" else torch.float32


def in_wider(gm: fx.GraphModule, wide: torch.dtype) -> fx.GraphModule:
    """A copy of the piece that computes in ``wide``: every narrower floating dtype constant in its nodes' arguments
    (the ``.to(input_dtype)`` of a norm) becomes ``wide``, so no step rounds to the piece's low precision."""
    twin = copy.deepcopy(gm)
    narrower = {d for d in _LOW_PRECISION if torch.finfo(d).bits < torch.finfo(wide).bits}

    def widen(a: Any) -> Any:
        return wide if isinstance(a, torch.dtype) and a in narrower else a

    for node in twin.graph.nodes:
        node.args = fx.node.map_aggregate(node.args, widen)
        node.kwargs = fx.node.map_aggregate(node.kwargs, widen)
    twin.recompile()
    return twin


def inductor(config_patches: dict[str, Any] | None = None,
             decompositions: dict[Any, Any] | None = None) -> Compile:
    """Compile a piece with Inductor, with the engine's config patches (vLLM passes its own post-grad pass manager
    through them) and, for the pass search, a decomposition table of our choosing. Caches are off: the search
    changes what the cache key does not see (the decomposition table)."""
    from torch._inductor.compile_fx import compile_fx

    def compile_piece(gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        patches = {"force_disable_caches": True, **(config_patches or {})}
        return compile_fx(copy.deepcopy(gm), inputs, config_patches=patches, decompositions=decompositions)

    return compile_piece


def outputs(result: Any) -> list[torch.Tensor]:
    flat: list[torch.Tensor] = []
    fx.node.map_aggregate(result, lambda v: flat.append(v) if floating(v) else None)
    return flat


class _TopK(fx.Interpreter):
    """Runs a graph and keeps the input and k of every top-k it calls (an MoE router's expert choice)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.choices: list[tuple[torch.Tensor, int]] = []

    def run_node(self, n: fx.Node) -> Any:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        if n.target in (torch.topk, "topk", torch.ops.aten.topk.default) and args and floating(args[0]):
            k = args[1] if len(args) > 1 else kwargs.get("k")
            self.choices.append((args[0].detach(), int(k)))
        return super().run_node(n)


def _tied_rows(eager: _TopK, truth: _TopK) -> set[int]:
    """Tokens whose top-k choice is decided by less than the piece's own rounding (``routing_tie_rows``): compiled
    code that rounds a router's logits differently may route them elsewhere, a discrete jump that is not a bug, so
    their rows are not compared."""
    from ekka_core.capture.routing import routing_tie_rows

    tied: set[int] = set()
    for (x, k), (y, _k) in zip(eager.choices, truth.choices):
        if x.shape == y.shape and x.dim() >= 1:
            mask, _margin, _noise = routing_tie_rows(y, x, k)
            tied.update(int(i) for i in mask.nonzero().flatten())
    return tied


def score(gm: fx.GraphModule, inputs: list[Any], dtype: str, compile_piece: Compile) -> tuple[float, int | None, float | None]:
    """(error ratio of the compiled piece, its worst row, that row's ratio): compiled as the target, eager as the
    low-precision reference, the wider-precision run as the truth. A piece with no floating output scores 0
    (nothing to round); rows of tokens whose routing is a tie (see :func:`_tied_rows`) are left out."""
    with torch.no_grad():
        eager_run = _TopK(gm)
        eager = outputs(eager_run.run(*fresh(inputs)))
        if not eager:
            return 0.0, None, None
        compiled = outputs(compile_piece(gm, fresh(inputs))(*fresh(inputs)))
        if _identical(compiled, eager):
            # Compiled code that computes eager's bits exactly (an extern kernel both call: vLLM-CPU's oneDNN
            # linears) cannot be where compilation departs, whatever the truth: ratio 0 without a wider twin.
            return 0.0, None, None
        wide = truth_dtype(dtype)
        truth_run = _TopK(in_wider(gm, wide))
        truth = outputs(truth_run.run(*[x.to(wide) if floating(x) else x for x in fresh(inputs)]))
    tied = _tied_rows(eager_run, truth_run)
    worst, worst_row, worst_row_ratio = 0.0, None, None
    compared = 0
    for x_t, x_r, y_r in zip(compiled, eager, truth):
        x_t, x_r, y_r = (_without(_rows(x.double()), tied) for x in (x_t, x_r, y_r))
        if x_r.numel() == 0:        # an empty output, or every row a routing tie: nothing of it to compare
            continue
        compared += 1
        # No trustworthy eager run or truth to measure against: not compared, never "agrees".
        if not torch.isfinite(x_r).all():
            raise NotComparable("the piece's eager replay is not finite on these inputs")
        if not torch.isfinite(y_r).all():
            raise NotComparable("the piece's wider-precision twin is not finite (an op the twin cannot widen, e.g. a "
                                "kernel with prepacked low-precision weights)")
        if not torch.isfinite(x_t).all():
            return finite_ratio(math.inf), None, None
        overall = float(error_ratio(x_t, x_r, y_r, dtype))
        rows = error_ratio(x_t, x_r, y_r, dtype, dim=1)
        if overall >= worst:
            worst = overall
            r = int(rows.argmax())
            worst_row, worst_row_ratio = r, finite_ratio(float(rows[r]))
    if not compared:
        raise NotComparable("no output value of the piece is left to compare (empty outputs, or every row a routing "
                            "tie)")
    return finite_ratio(worst), worst_row, worst_row_ratio


def _identical(compiled: list[torch.Tensor], eager: list[torch.Tensor]) -> bool:
    """Bit for bit, on finite eager values only: a NaN the eager run shares (fed from an earlier piece) is no
    comparison at all, so it never counts as agreeing."""
    return len(compiled) == len(eager) and all(
        x_t.shape == x_r.shape and x_t.dtype == x_r.dtype and bool(torch.isfinite(x_r).all()) and torch.equal(x_t, x_r)
        for x_t, x_r in zip(compiled, eager))


def _without(rows: torch.Tensor, tied: set[int]) -> torch.Tensor:
    """The rows that are not tied tokens (when the output has one row per token, as a router's input has)."""
    if not tied or rows.shape[0] <= max(tied):
        return rows
    keep = torch.ones(rows.shape[0], dtype=torch.bool)
    keep[sorted(tied)] = False
    return rows[keep]


def _rows(x: torch.Tensor) -> torch.Tensor:
    """Rows × features: a token's row is the unit a bug confined to a few tokens shows in."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    return x.reshape(-1, x.shape[-1]) if x.dim() >= 2 else x.reshape(1, -1)
