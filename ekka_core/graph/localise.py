"""The stage's entry: :func:`localise_in_graph`.

Hooks do not fire inside a compiled graph, so a compile-only divergence is localised on the graph itself: split it
along module boundaries (decoder layer, then the suspect layer's children, then the suspect child's nodes), run
each piece compiled and eagerly on the same inputs, and take the first piece whose compiled output departs beyond
the noise of correct compilation. Then name the compiler stage whose removal brings that piece back.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import fx

from ekka_core.contracts.graph import GraphLocalisation, NodeSource, PassFinding, PieceResult
from ekka_core.contracts.ranking import finite_ratio
from ekka_core.graph.passes import rewritten_nodes, toggles
from ekka_core.graph.pieces import Piece, by_module, by_node, node_source, split_by_module
from ekka_core.graph.replay import Compile, NotComparable, inductor, piece_inputs, score

NOISE_FILE = Path(__file__).with_name("compile_noise.json")
# A departure must stand this far above the largest ratio measured on clean compiled graphs (as for conventions).
COMPILE_NOISE_FACTOR = 4.0

Progress = Callable[[str], None]
# How many times a piece that cannot be compared is split further (decoder layer → attention/MLP → projection).
MAX_LEVELS = 3


@dataclass(frozen=True)
class Limits:
    """A piece departs when its ratio, or its worst row's (a bug confined to a few tokens), passes its limit."""
    piece: float
    row: float

    def departs(self, ratio: float, row_ratio: float | None) -> bool:
        return ratio > self.piece or (row_ratio is not None and row_ratio > self.row)


@functools.cache
def _compile_noise() -> dict[str, Any]:
    return json.loads(NOISE_FILE.read_text()) if NOISE_FILE.exists() else {}


def compile_threshold(threshold: float, *, rows: bool = False) -> float:
    """The spec's threshold, raised to a multiple of the largest clean compiled-vs-eager ratio measured (of a whole
    piece, or of its worst row) on every zoo architecture (``benchmarks/compile_noise.py``)."""
    measured = _compile_noise().get("largest_clean_row_ratio" if rows else "largest_clean_ratio", 0.0)
    return max(threshold, COMPILE_NOISE_FACTOR * measured)


def localise_in_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], *, dtype: str,
                      config_patches: dict[str, Any] | None = None, threshold: float = 2.0,
                      progress: Progress | None = None) -> GraphLocalisation:
    """Localise a compiled graph's departure from its own eager run to a module, its graph nodes and a pass.

    ``gm`` is a Dynamo graph (nodes carry ``nn_module_stack`` and ``stack_trace``), ``example_inputs`` the real values
    it was called with, ``config_patches`` the Inductor config the engine compiles with."""
    return localise_in_pieces([(gm, list(example_inputs), config_patches)], dtype=dtype, threshold=threshold,
                              progress=progress)


def localise_in_pieces(graphs: Sequence[tuple[fx.GraphModule, list[Any], dict[str, Any] | None]], *, dtype: str,
                       threshold: float = 2.0, progress: Progress | None = None) -> GraphLocalisation:
    """The same over the graphs an engine compiles one after another (vLLM compiles the pieces between two
    attention calls separately), each with its real inputs and the Inductor config it is compiled with."""
    say = progress or (lambda _m: None)
    limit = Limits(compile_threshold(threshold), compile_threshold(threshold, rows=True))
    out = GraphLocalisation(replayable=True, threshold=limit.piece, row_threshold=limit.row, dtype=dtype)
    try:
        for gm, inputs, config_patches in graphs:
            compile_piece = inductor(config_patches)
            layer = _first_departing(gm, inputs, by_module(0), dtype, compile_piece, limit, say, out.pieces)
            if layer is not None:
                break
        else:
            return out
        piece, inputs, result = layer
        child = _first_departing(piece.graph, inputs, by_module(1, within=piece.module), dtype, compile_piece,
                                 limit, say, out.inner_pieces)
        if child is not None:
            piece, inputs, result = child
        out.suspect = result
        out.passes, out.tried_toggles = _name_the_pass(piece, inputs, dtype, config_patches, limit, say)
        out.suspect_nodes, out.node_words = _departing_nodes(piece, inputs, dtype, compile_piece, limit, say)
        passes = [p for p in out.passes if p.stage == "post-grad pass"]
        if passes and out.node_words.startswith("no node"):
            # A rewrite across nodes: the nodes the named pass rewired are the ones whose fused kernel differs.
            rewired = rewritten_nodes(piece.graph, inputs, config_patches, passes[0].name)
            if rewired:
                out.suspect_nodes = _unique_lines(node_source(n) for n in rewired)
                out.node_words = f"the nodes the post-grad pass {passes[0].name} rewrote"
    except Exception as exc:        # a graph Inductor or the FX splitter cannot take: say so, decide nothing
        return GraphLocalisation.unreplayable(
            f"the compiled graph could not be split and replayed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}", dtype=dtype, threshold=limit.piece,
            row_threshold=limit.row, pieces=out.pieces, inner_pieces=out.inner_pieces)
    return out


def _first_departing(gm: fx.GraphModule, inputs: list[Any], key: Any, dtype: str, compile_piece: Compile,
                     limit: Limits, say: Progress, scored: list[PieceResult], levels: int = MAX_LEVELS
                     ) -> tuple[Piece, list[Any], PieceResult] | None:
    """Score the pieces of ``gm`` in graph order; the first that departs (with its inputs), or None. A piece that
    cannot be compared as a whole is split into its children, which are scored in its place (a norm or an
    activation stays comparable where a kernel with prepacked weights next to it is not)."""
    split = split_by_module(gm, key)
    fed = piece_inputs(split, inputs)
    for piece in split.pieces:
        say(f"compiled vs eager: {piece.module or '(graph)'}")
        not_compared = None
        try:
            ratio, row, row_ratio = score(piece.graph, fed[piece.submodule], dtype, compile_piece)
        except NotComparable as why:
            ratio, row, row_ratio, not_compared = math.nan, None, None, str(why)
        result = PieceResult(index=piece.index, module=piece.module, module_class=piece.module_class,
                             nodes=len(_computing(piece.graph)),
                             error_ratio=None if not_compared else finite_ratio(ratio), worst_row=row,
                             worst_row_ratio=row_ratio, not_compared=not_compared,
                             departs=not_compared is None and limit.departs(ratio, row_ratio))
        scored.append(result)
        if result.departs:
            return piece, fed[piece.submodule], result
        if not_compared and levels > 1 and len(_computing(piece.graph)) > 1:
            start = len(scored)
            deeper = _first_departing(piece.graph, fed[piece.submodule], by_module(1, within=piece.module), dtype,
                                      compile_piece, limit, say, scored, levels - 1)
            if deeper is not None:
                return deeper
            children = scored[start:]
            result.covered_by_children = bool(children) and all(
                c.not_compared is None or c.covered_by_children for c in children)
    return None


def _departing_nodes(piece: Piece, inputs: list[Any], dtype: str, compile_piece: Compile, limit: Limits,
                     say: Progress) -> tuple[list[NodeSource], str]:
    """The suspect piece's nodes whose own compiled code departs; when none does alone, the departure is made
    across nodes (a fusion or a rewrite of a pattern), and every computing node of the piece is listed."""
    split = split_by_module(piece.graph, by_node())
    fed = piece_inputs(split, inputs)
    departing: list[NodeSource] = []
    for sub in split.pieces:
        say(f"compiled vs eager: node {sub.module}")
        try:
            ratio, _row, row_ratio = score(sub.graph, fed[sub.submodule], dtype, compile_piece)
        except NotComparable:
            continue
        if limit.departs(ratio, row_ratio):
            departing.extend(node_source(n) for n in _computing(sub.graph))
    if departing:
        return departing, "each node compiled alone: these depart"
    listed = [node_source(n) for n in _computing(piece.graph)]
    return listed, "no node departs compiled alone, only the piece's nodes compiled together (a fusion or a " \
                   "rewrite across nodes): the piece's nodes"


def _name_the_pass(piece: Piece, inputs: list[Any], dtype: str, config_patches: dict[str, Any] | None,
                   limit: Limits, say: Progress) -> tuple[list[PassFinding], list[str]]:
    found, tried = [], []
    for toggle in toggles(piece.graph, inputs, config_patches):
        say(f"compiled vs eager, {toggle.words}")
        tried.append(f"{toggle.stage}: {toggle.name}")
        try:
            with (toggle.around() if toggle.around else nullcontext()):
                ratio, _row, row_ratio = score(piece.graph, inputs, dtype, toggle.compile_piece)
        except NotComparable:
            continue
        except Exception as exc:   # one stage Inductor cannot do without: that toggle is not tried, the rest are
            tried[-1] += f" (could not compile without it: {type(exc).__name__})"
            continue
        if not limit.departs(ratio, row_ratio):
            found.append(PassFinding(stage=toggle.stage, name=toggle.name, ratio_without=ratio,
                                     words=f"{toggle.words}, the piece agrees (compiled vs eager ratio "
                                           f"{ratio:.2f})"))
    found.sort(key=lambda f: _STAGE_ORDER.get(f.stage, 3))
    return found, tried


def _unique_lines(sources: Any) -> list[NodeSource]:
    """One entry per source line (a rewrite touches several nodes traced from one line)."""
    seen, kept = set(), []
    for s in sources:
        if (s.file, s.line) not in seen or s.line is None:
            seen.add((s.file, s.line))
            kept.append(s)
    return kept


# Findings in order of specificity: a pass of the engine's own before a decomposition or a config flag (removing a
# decomposition can also just hide the pattern a pass matches).
_STAGE_ORDER = {"post-grad pass": 0, "pre-grad pass": 0, "decomposition": 1, "inductor config": 2}


def _computing(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


