"""The graph check (``checks/graph.py``) on hand-made in-graph localisations, and its finding on every surface:
a departing piece is a ``compiled`` suspect with its graph nodes, source lines and compiler stage (report.json,
report.md, report.html with the per-piece plot, the CLI's source column, the language server's diagnostics on the
node's line); a graph that could not be replayed, or a piece not compared, is never an agreement."""

from __future__ import annotations

import json

from ekka_core.checks import AFTER_COMPARISON, Evidence, compose, conclude, run_check
from ekka_core.checks.graph import GraphCheck
from ekka_core.checks.output import SERVED_OUTPUT
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.graph import GraphLocalisation, NodeSource, PassFinding, PieceResult
from ekka_core.contracts.ranking import Ranking
from ekka_core.contracts.report import CheckRecord, Report, RunMeta
from ekka_core.contracts.serving import PositionRatio, SymptomCheck
from ekka_core.report import build_report, render_html, render_markdown, source_of

from hand_made import SPEC

ACTIVATION = "/venv/lib/python3.11/site-packages/vllm/model_executor/layers/activation.py"


def _piece(i: int, module: str, ratio: float | None, departs: bool = False, why: str | None = None,
           covered: bool = False) -> PieceResult:
    return PieceResult(index=i, module=module, module_class="X", nodes=3, error_ratio=ratio, departs=departs,
                       not_compared=why, covered_by_children=covered)


def _departing() -> GraphLocalisation:
    suspect = _piece(1, "model.layers.0.mlp.act_fn", 56.0, departs=True)
    return GraphLocalisation(
        replayable=True, threshold=4.0, row_threshold=7.1, dtype="bfloat16",
        pieces=[_piece(0, "model.embed_tokens", 0.0), _piece(1, "model.layers.0", None, why="prepacked", covered=True),
                _piece(2, "model.layers.0.input_layernorm", 1.0), suspect],
        suspect=suspect, root="model",
        suspect_nodes=[NodeSource("silu", "aten.silu", ACTIVATION, 144, "return F.silu(x[..., :d]) * x[..., d:]",
                                  "model.layers.0.mlp.act_fn")],
        node_words="each node compiled alone: these depart",
        passes=[PassFinding("decomposition", "aten.silu.default", 1.0,
                            "with Inductor's decomposition of aten.silu.default removed, model.layers.0.mlp.act_fn "
                            "agrees (compiled vs eager ratio 1.00)")],
        notes=["vLLM's compile cache was off for this run"])


def _served(diverges: bool = True) -> SymptomCheck:
    return SymptomCheck("served configuration", 9.0 if diverges else 1.0, diverges, 2.0,
                        positions=[PositionRatio(0, i, 1.0, True) for i in range(3)])


def _clean_comparison() -> CheckOutcome:
    return CheckOutcome(CheckRecord("modules", "agrees", compared=10))


def _evidence(graph: GraphLocalisation | None) -> Evidence:
    ev = Evidence(SPEC, served_check=_served(), outcomes=[_clean_comparison()], graph=graph)
    ev.outcomes.append(SERVED_OUTPUT.run(ev))
    ev.outcomes.append(run_check(GraphCheck(), ev))
    return ev


def test_the_graph_check_is_registered_and_skipped_without_a_localisation():
    assert any(isinstance(c, GraphCheck) for c in AFTER_COMPARISON)
    outcome = run_check(GraphCheck(), Evidence(SPEC))
    assert outcome.status == "skipped" and "in-graph localisation" in outcome.record.words


def test_a_departing_piece_is_a_compiled_suspect_with_nodes_lines_and_the_stage():
    ev = _evidence(_departing())
    graph = ev.outcomes[-1]
    assert graph.status == "diverges" and graph.record.compared == 3
    c = compose(ev)
    assert c.verdict == "divergent"
    top = c.suspects[0]
    assert (top.rank, top.module, top.kind) == (1, "model.layers.0.mlp.act_fn", "compiled")
    assert top.graph_nodes[0].line == 144 and top.compiler_stages[0].name == "aten.silu.default"
    assert "silu at vllm/model_executor/layers/activation.py:144" in top.evidence
    assert "compiler stage: decomposition aten.silu.default" in top.evidence


def test_a_graph_that_could_not_be_replayed_is_never_an_agreement():
    g = GraphLocalisation(replayable=False, threshold=0.0, row_threshold=0.0, dtype="bfloat16",
                          reason="the compiled graph could not be split and replayed: RuntimeError: boom")
    ev = _evidence(g)
    outcome = ev.outcomes[-1]
    assert outcome.status == "inconclusive" and "RuntimeError: boom" in outcome.record.missing[0]
    c = compose(ev)
    # the served output diverges (observed): divergent with no suspect, and the lead says what was not observed
    assert c.verdict == "divergent" and c.suspects == []
    assert "RuntimeError: boom" in c.lead_notes[0]
    # without a served divergence to stand on, the same gap is inconclusive, never consistent
    quiet = Evidence(SPEC, outcomes=[_clean_comparison()], graph=g)
    quiet.outcomes.append(run_check(GraphCheck(), quiet))
    assert compose(quiet).verdict == "inconclusive"


def test_a_piece_not_compared_and_not_covered_by_its_children_leaves_the_check_inconclusive():
    g = GraphLocalisation(replayable=True, threshold=4.0, row_threshold=7.1, dtype="bfloat16",
                          pieces=[_piece(0, "model.embed_tokens", 0.0),
                                  _piece(1, "model.layers.0", None, why="twin not finite")])
    outcome = run_check(GraphCheck(), Evidence(SPEC, graph=g))
    assert outcome.status == "inconclusive" and "model.layers.0: twin not finite" in outcome.record.missing[0]
    g.pieces[1].covered_by_children = True           # split, and every child was compared
    assert g.conclusive and run_check(GraphCheck(), Evidence(SPEC, graph=g)).status == "agrees"


def _report(tmp_path) -> Report:
    ev = _evidence(_departing())
    ranking = Ranking("consistent", 2.0, "bfloat16")
    composed = conclude(ev, ranking)
    report = build_report(ranking, spec=SPEC, meta=RunMeta(), missing=composed.missing,
                          checks=[o.record for o in ev.outcomes], graph=ev.graph)
    path = tmp_path / "report.json"
    report.save(path)
    return Report.load(path)        # every surface reads it back from JSON


def test_the_compiled_finding_round_trips_and_is_rendered_on_every_report_surface(tmp_path):
    report = _report(tmp_path)
    top = report.top
    assert top is not None and top.kind == "compiled" and top.summary.startswith("compiled code departs")
    assert "aten.silu.default" in top.summary and "activation.py:144" in top.summary
    assert source_of(top) == "vllm/model_executor/layers/activation.py:144"
    assert report.graph is not None and len(report.graph.pieces) == 4 and report.graph.root == "model"
    md = render_markdown(report)
    assert "## Inside the compiled graph" in md and "`model.layers.0.mlp.act_fn` | X | 3 | 56.0 |" in md
    assert "compared child by child" in md and "decomposition `aten.silu.default`" in md
    page = render_html(report)
    assert 'aria-label="compiled vs eager ratio per piece of the graph"' in page
    plot = page.split('aria-label="compiled vs eager ratio per piece of the graph"', 1)[1].split("</svg>", 1)[0]
    assert plot.count("<rect") == 1 + 4                      # the frame, then one bar per piece
    assert plot.count('fill="#c0392b"') == 1 and plot.count('fill="#bbb"') == 1   # the departing one; a stub
    assert json.loads((tmp_path / "report.json").read_text())["suspects"][0]["graph_nodes"][0]["line"] == 144


def test_a_report_without_a_localisation_has_no_graph_section(tmp_path):
    ranking = Ranking("consistent", 2.0, "bfloat16")
    report = build_report(ranking, spec=SPEC, meta=RunMeta())
    assert "Inside the compiled graph" not in render_markdown(report)
    assert "compiled vs eager ratio per piece" not in render_html(report)


def test_the_language_server_marks_the_graph_nodes_source_line(tmp_path):
    from server.present import Result, diagnostics, path_key
    from server.protocol import CODE_SUSPECT_GRAPH_NODE

    report = _report(tmp_path)
    result = Result("job-1", report)
    published = diagnostics(result, lambda path, line: "        return F.silu(x[..., :d]) * x[..., d:]")
    on_node = published[path_key(ACTIVATION)]
    assert [d.range.start.line for d in on_node] == [143] and on_node[0].code == CODE_SUSPECT_GRAPH_NODE
    assert "compiled graph node traced from this line" in on_node[0].message
    assert "[compiled]" in on_node[0].message and "aten.silu.default" in on_node[0].message


def test_module_paths_are_rooted_once_in_the_engines_names_even_where_the_suspect_is_one_of_the_pieces():
    suspect = _piece(1, "layers.0.mlp", 9.0, departs=True)
    g = GraphLocalisation(replayable=True, threshold=4.0, row_threshold=7.1, dtype="bfloat16",
                          pieces=[_piece(0, "", 0.0), suspect], suspect=suspect,
                          suspect_nodes=[NodeSource("silu", "silu", None, None, None, "layers.0.mlp.act_fn")],
                          passes=[PassFinding("decomposition", "aten.silu.default", 1.0,
                                              "with it removed, the piece agrees (compiled vs eager ratio 1.00)")])
    g.rooted("model").rooted("other")                  # a second call changes nothing
    assert [p.module for p in g.pieces] == ["model", "model.layers.0.mlp"] and g.suspect.module == "model.layers.0.mlp"
    assert g.suspect_nodes[0].module == "model.layers.0.mlp.act_fn" and g.root == "model"
    # the stage's words name no module path (the finding names the module), so rooting never rewrites them
    assert g.passes[0].words == "with it removed, the piece agrees (compiled vs eager ratio 1.00)"
