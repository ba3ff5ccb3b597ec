"""The graph check: when configuration triage finds that compilation makes the difference, does the engine's
compiled graph depart from the same graph run eagerly, and where (:mod:`ekka_core.graph`, run in the engine).

Hooks do not fire inside a compiled graph, so the traced comparison stops at "diverges only with compilation on".
The in-graph localisation replays the graph the engine compiled on the values of its first real step, piece by piece
along module boundaries; its suspect is a finding of its own kind (``compiled``): the module, the graph nodes whose
compiled code departs (each with its engine source line) and the compiler stage whose removal brings it back.

What it says when it finds nothing matters as much: a graph that could not be split or replayed, or a piece that
could not be compared, leaves the check ``inconclusive`` (the verdict is then at best triage's backend-level words,
never ``consistent``); only a graph every piece of which was compared, each within the noise of correct compilation,
``agrees`` — the compile-only difference is then outside the graph's generated code.
"""

from __future__ import annotations

import math

from ekka_core.checks.base import Evidence, source_location
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.graph import GraphLocalisation, NodeSource
from ekka_core.contracts.ranking import Suspect
from ekka_core.contracts.report import CheckRecord, fmt_ratio
from ekka_core.sources import short_path

NAME = "graph"
NODES_NAMED = 4         # graph nodes named in the evidence's words (all are kept in the finding)


class GraphCheck:
    name = NAME
    needs = ("graph",)

    def run(self, evidence: Evidence) -> CheckOutcome:
        g = evidence.graph
        assert g is not None
        scored = [p for p in [*g.pieces, *g.inner_pieces] if p.error_ratio is not None]
        if g.departs:
            assert g.suspect is not None
            finding = _suspect(evidence, g)
            words = (f"the compiled graph departs from itself run eagerly at {g.suspect.module} "
                     f"(ratio {fmt_ratio(g.suspect.error_ratio)}, limit {fmt_ratio(g.threshold)})")
            if g.passes:
                words += f"; {g.passes[0].words}"
            return CheckOutcome(CheckRecord(NAME, "diverges", words, compared=len(scored),
                                            statistic=g.suspect.error_ratio),
                                findings=[finding], notes=list(g.notes))
        if not g.conclusive:
            return CheckOutcome(CheckRecord(NAME, "inconclusive", "the compiled graph was not compared in full",
                                            compared=len(scored), missing=[_missing(g)]),
                                notes=list(g.notes))
        largest = max((p.error_ratio for p in scored), default=0.0)
        return CheckOutcome(CheckRecord(
            NAME, "agrees", f"every piece of the compiled graph agrees with itself run eagerly (largest ratio "
                            f"{fmt_ratio(largest)}, limit {fmt_ratio(g.threshold)}): the compile-only difference is "
                            "outside the graph's generated code (graph capture, the custom ops compilation selects)",
            compared=len(scored), statistic=largest), notes=list(g.notes))


def _missing(g: GraphLocalisation) -> str:
    if not g.replayable:
        why = g.reason or "the compiled graph could not be split and replayed"
    else:
        uncompared = [p for p in g.pieces if p.not_compared and not p.covered_by_children]
        first = uncompared[0] if uncompared else None
        why = (f"{len(uncompared)} piece(s) of the compiled graph could not be compared"
               + (f" ({first.module}: {first.not_compared})" if first else "") + "; none of those compared departs")
    return (f"in-graph localisation: {why} — so it is not known which compiled module makes the difference; "
            "triage's backend narrowing above is the last conclusive step (fix: diagnose the compiled graph "
            "by hand with TORCHDYNAMO_REPRO_AFTER=aot, or serve with enforce_eager until it is found)")


def _suspect(evidence: Evidence, g: GraphLocalisation) -> Suspect:
    s = g.suspect
    assert s is not None
    file, line, ffile, fline = source_location(evidence, s.module)
    pair = next((p for p in (evidence.ranking.pairs if evidence.ranking else []) if p.component == s.module), None)
    ratio = s.error_ratio if s.error_ratio is not None else math.nan
    nodes = [n for n in g.suspect_nodes if n.file]
    return Suspect(rank=0, module=s.module, cls=s.module_class or (pair.cls if pair else ""), file=file, line=line,
                   forward_file=ffile, forward_line=fline,
                   reference_modules=list(pair.reference_modules) if pair else [], error_ratio=ratio,
                   input_ratio=None, onset_token=None, onset_phase=None, kind="compiled",
                   graph_nodes=list(g.suspect_nodes), compiler_stages=list(g.passes),
                   evidence=_evidence(g, nodes))


def _evidence(g: GraphLocalisation, nodes: list[NodeSource]) -> str:
    s = g.suspect
    assert s is not None
    row = (f"; worst token row {s.worst_row} at {fmt_ratio(s.worst_row_ratio)}"
           if s.worst_row is not None and s.worst_row_ratio is not None else "")
    text = (f"compiled vs eager on the engine's own graph and inputs: error ratio {fmt_ratio(s.error_ratio)} "
            f"(limit {fmt_ratio(g.threshold)}, from clean compiled graphs of every zoo architecture){row}")
    if nodes:
        named = ", ".join(f"{n.op} at {short_path(n.file)}:{n.line}" for n in nodes[:NODES_NAMED])
        more = f" and {len(nodes) - NODES_NAMED} more" if len(nodes) > NODES_NAMED else ""
        text += f"; graph nodes ({g.node_words}): {named}{more}"
    if g.passes:
        text += f"; compiler stage: {g.passes[0].stage} {g.passes[0].name} — {g.passes[0].words}"
    else:
        text += ("; no single compiler stage tried turns it off (" + ", ".join(g.tried_toggles[:6])
                 + (", …" if len(g.tried_toggles) > 6 else "") + ")")
    return text
