"""What in-graph localisation hands on: compiled-vs-eager ratios per piece of a compiled graph, the suspect piece,
the graph nodes in it whose compiled code departs, and the compiler stage that turns the departure off.

Torch-free, like the other contracts, so that the report and the shells read it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NodeSource:
    """One FX node of the graph and the source line it was traced from (its ``stack_trace``'s innermost frame)."""
    node: str
    op: str                        # the node's target, printed (``aten.silu``, ``torch.nn.functional.silu``)
    file: str | None
    line: int | None
    code: str | None               # the source line's text, as the stack trace gives it
    module: str | None = None      # the innermost module the node was traced from ("layers.0.post_attention_layernorm")


@dataclass
class PieceResult:
    """One piece of the graph: the nodes traced from one module call, compiled alone and run on the inputs the eager
    graph fed it.

    ``error_ratio`` is the paper's ratio with the compiled piece as target, the eager piece as the low-precision
    reference and the same piece in wider precision (fp32 for bf16) as the truth: ≈ 1 when compiled code rounds like eager code.
    """
    index: int
    module: str                    # the module path the piece's nodes were traced from ("layers.1.mlp")
    module_class: str | None
    nodes: int
    error_ratio: float | None      # None: not compared (``not_compared`` says why)
    worst_row: int | None = None   # the row (token) whose ratio is largest, and that ratio
    worst_row_ratio: float | None = None
    departs: bool = False
    not_compared: str | None = None  # why this piece could not be scored (then it never counts as agreeing)
    # A piece not compared as a whole that was split and whose every child was compared (or is covered in turn):
    # its computation was observed, child by child.
    covered_by_children: bool = False


@dataclass
class PassFinding:
    """A compiler stage whose removal brings the suspect piece back within noise."""
    stage: str                     # "decomposition", "post-grad pass", "pre-grad pass", "inductor config"
    name: str                      # e.g. "aten.silu.default", "fuse_norm_quant", "pattern_matcher"
    ratio_without: float
    words: str


@dataclass
class GraphLocalisation:
    """The outcome: ``departs`` is False with ``pieces`` all within noise (the compiled graph agrees with itself run
    eagerly), True with a suspect; ``replayable`` False when the graph could not be split or replayed (``reason``)."""
    replayable: bool
    threshold: float
    row_threshold: float
    dtype: str
    pieces: list[PieceResult] = field(default_factory=list)          # the graph's pieces, one per top-level module
    inner_pieces: list[PieceResult] = field(default_factory=list)    # the departing piece's children
    suspect: PieceResult | None = None
    suspect_nodes: list[NodeSource] = field(default_factory=list)
    node_words: str = ""           # how the nodes were found ("compiled one at a time", "only together: a fusion")
    passes: list[PassFinding] = field(default_factory=list)
    tried_toggles: list[str] = field(default_factory=list)
    reason: str = ""
    notes: list[str] = field(default_factory=list)   # what the run that produced it changed (engine settings)
    # The engine module the graph was traced from ("model"), when known: module paths above are then the engine's
    # own (``model.layers.0.mlp``), as the traced comparison names them; "" leaves them relative to the graph.
    root: str = ""

    @classmethod
    def unreplayable(cls, reason: str, *, dtype: str, threshold: float = 0.0, row_threshold: float = 0.0,
                     **kept: object) -> "GraphLocalisation":
        """A graph that could not be localised, and why: never conclusive, so never an agreement."""
        return cls(replayable=False, threshold=threshold, row_threshold=row_threshold, dtype=dtype, reason=reason,
                   **kept)  # type: ignore[arg-type]

    @property
    def departs(self) -> bool:
        return self.suspect is not None

    def rooted(self, root: str) -> "GraphLocalisation":
        """The same result with every module path prefixed by ``root`` (the engine's name of the traced module)."""
        if not root or self.root:
            return self

        def path(p: str | None) -> str | None:
            return p if p is None else (f"{root}.{p}" if p else root)

        pieces = [*self.pieces, *self.inner_pieces, *([self.suspect] if self.suspect else [])]
        for piece in {id(p): p for p in pieces}.values():      # the suspect may be one of the pieces itself
            piece.module = path(piece.module) or root
        for node in self.suspect_nodes:
            node.module = path(node.module)
        self.root = root
        return self

    @property
    def conclusive(self) -> bool:
        """A departure was found, or every piece was replayed and scored (as a whole or child by child): only then
        may a verdict rest on it."""
        return self.departs or (self.replayable and bool(self.pieces)
                                and all(p.not_compared is None or p.covered_by_children for p in self.pieces))
