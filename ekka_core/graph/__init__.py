"""The in-graph localisation stage: a compile-only divergence localised inside the compiled graph — the piece
(module), its FX nodes with their source lines, and the compiler stage (decomposition, pass) that introduces it.

Entry point: :func:`localise_in_graph` (:mod:`~ekka_core.graph.localise`). Module by module:
:mod:`~ekka_core.graph.pieces` (splitting along ``nn_module_stack``), :mod:`~ekka_core.graph.replay` (compiled,
eager and wider-precision runs of one piece, scored with the error ratio), :mod:`~ekka_core.graph.passes` (one compiler
stage removed at a time).
"""

from ekka_core.contracts.graph import GraphLocalisation, NodeSource, PassFinding, PieceResult
from ekka_core.graph.localise import (COMPILE_NOISE_FACTOR, NOISE_FILE, compile_threshold, localise_in_graph,
                                      localise_in_pieces)

__all__ = ["COMPILE_NOISE_FACTOR", "GraphLocalisation", "NOISE_FILE", "NodeSource", "PassFinding", "PieceResult",
           "compile_threshold", "localise_in_graph", "localise_in_pieces"]
