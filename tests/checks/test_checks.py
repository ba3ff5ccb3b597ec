"""Checks as units and the verdict composer: each precedence row of checks/verdict.py, the non-finite check on
hand-made aligned pairs, and 'never consistent without having looked'."""

from __future__ import annotations


from ekka_core.analysis import analyse
from ekka_core.checks import AFTER_COMPARISON, Evidence, compose, conclude, run_check
from ekka_core.checks.modules import ModuleCheck
from ekka_core.checks.output import SERVED_OUTPUT
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.ranking import Ranking, Suspect
from ekka_core.contracts.report import CheckRecord, Unchecked
from ekka_core.contracts.serving import PositionRatio, SymptomCheck

from hand_made import SPEC, FakeAligned, aligned_pairs



def _suspect(module: str, kind: str = "module") -> Suspect:
    return Suspect(rank=0, module=module, cls="X", file=None, line=None, forward_file=None, forward_line=None,
                   reference_modules=[module], error_ratio=30.0, input_ratio=1.0, onset_token=0, onset_phase=None,
                   evidence="", kind=kind)


def _outcome(name: str, status: str, findings=(), missing=(), note: str = "", precedence: int = 1) -> CheckOutcome:
    return CheckOutcome(CheckRecord(name, status, missing=list(missing)), findings=list(findings),
                        deciding_note=note, precedence=precedence)


def _check(diverges: bool, positions: int = 3) -> SymptomCheck:
    return SymptomCheck("served configuration", 9.0 if diverges else 1.0, diverges, 2.0,
                        positions=[PositionRatio(0, i, 1.0, True) for i in range(positions)])


# -- the composer, row by row ---------------------------------------------------------------------------------
def test_row1_inputs_differ_wins_over_everything():
    ev = Evidence(SPEC, outcomes=[_outcome("inputs", "diverges"), _outcome("modules", "diverges", [_suspect("a")])])
    assert compose(ev).verdict == "inputs-differ" and compose(ev).suspects == []


def test_row2_a_higher_precedence_ranks_first_and_a_module_is_listed_once():
    ev = Evidence(SPEC, outcomes=[
        _outcome("modules", "diverges", [_suspect("m.layers.3"), _suspect("m.layers.1.mlp")]),
        _outcome("non-finite", "diverges", [_suspect("m.layers.1.mlp", "non-finite")], precedence=0),
        _outcome("conventions", "agrees", [_suspect("m.norm", "convention")])])
    c = compose(ev)
    assert c.verdict == "divergent"
    assert [(s.module, s.kind, s.rank) for s in c.suspects] == [("m.layers.1.mlp", "non-finite", 1),
                                                                 ("m.layers.3", "module", 2)]
    assert [(s.module, s.rank) for s in c.conventions] == [("m.norm", 3)]


def test_row3_conventions_decide_only_without_a_ratio_level_finding():
    conv = _outcome("conventions", "diverges", [_suspect("m.norm", "convention")], note="rounding departs")
    c = compose(Evidence(SPEC, outcomes=[_outcome("modules", "agrees"), conv]))
    assert c.verdict == "divergent" and [s.module for s in c.suspects] == ["m.norm"]
    assert c.lead_notes == ["rounding departs"]


def test_row4_served_output_diverging_is_divergent_even_with_no_module_explaining_it():
    ev = Evidence(SPEC, served_check=_check(True), outcomes=[_outcome("modules", "agrees")])
    ev.outcomes.append(SERVED_OUTPUT.run(ev))
    c = compose(ev)
    assert c.verdict == "divergent" and c.suspects == []
    assert c.lead_notes[0].startswith("the served configuration diverges at the output level (ratio 9.00)")


def test_row5_nothing_compared_is_inconclusive_not_consistent():
    ranking = Ranking("consistent", 2.0, "bfloat16", unchecked=[Unchecked("model.layers.0.mlp", "no rule")])
    ev = Evidence(SPEC, ranking=ranking)
    ev.outcomes.append(run_check(ModuleCheck(), ev))
    c = compose(ev)
    assert c.verdict == "inconclusive"
    assert "no module was compared (no rule)" in c.missing[0]


def test_row5_an_output_check_that_compared_no_position_is_inconclusive():
    ev = Evidence(SPEC, served_check=_check(False, positions=0), outcomes=[_outcome("modules", "agrees")])
    ev.outcomes.append(SERVED_OUTPUT.run(ev))
    assert compose(ev).verdict == "inconclusive"


def test_row6_consistent_when_every_check_looked_and_agrees():
    ev = Evidence(SPEC, served_check=_check(False), outcomes=[_outcome("modules", "agrees")])
    ev.outcomes.append(SERVED_OUTPUT.run(ev))
    assert compose(ev).verdict == "consistent"


def test_a_check_without_its_evidence_is_skipped_not_agreeing():
    out = run_check(ModuleCheck(), Evidence(SPEC))
    assert out.status == "skipped" and "no traced module comparison" in out.record.words


def test_the_registry_holds_the_checks_the_docstring_names():
    import ekka_core.checks as checks
    for check in AFTER_COMPARISON:
        assert f"``{check.name}``" in checks.__doc__


def test_an_alignment_failure_on_the_residual_stream_makes_a_clean_comparison_inconclusive():
    pairs, classes = aligned_pairs(None)
    ranking = analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    assert run_check(ModuleCheck(), Evidence(SPEC, ranking=ranking)).status == "agrees"
    # off the output path (an activation inside the MLP): listed, and the verdict can still be consistent
    ranking.unchecked.append(Unchecked("model.layers.1.mlp.act_fn", "alignment failed: shapes differ"))
    assert run_check(ModuleCheck(), Evidence(SPEC, ranking=ranking)).status == "agrees"
    # a decoder layer's output: what reaches the logits was not seen
    ranking.unchecked.append(Unchecked("model.layers.2", "alignment failed: rows differ"))
    out = run_check(ModuleCheck(), Evidence(SPEC, ranking=ranking))
    assert out.status == "inconclusive" and "model.layers.2" in out.record.missing[0]
    assert compose(Evidence(SPEC, outcomes=[out])).verdict == "inconclusive"


# -- the row-level check ---------------------------------------------------------------------------------------
from ekka_core.checks.rows import ROW_NOISE, RowCheck  # noqa: E402


def _row_bug(pairs, start: int, row: int, factor: float, *, persist: bool = True):
    """Row ``row`` of every output from item ``start`` on (or of that item only) ``factor``× the reference's
    own error away from fp32."""
    items = pairs.items[start:] if persist else pairs.items[start:start + 1]
    for it in items:
        err = it.reference[row] - it.reference_fp32[row]
        it.target[row] = it.reference_fp32[row] + factor * err


def test_a_module_wrong_on_one_row_is_found_although_its_pooled_ratio_is_under_the_threshold():
    pairs, classes = aligned_pairs(None)
    _row_bug(pairs, 5, row=7, factor=5.0)                 # model.layers.1.mlp from token 7 on, every later module
    ranking = analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    assert ranking.suspects == []                          # the pooled comparison sees nothing
    out = RowCheck().run(Evidence(SPEC, ranking=ranking, aligned=FakeAligned(pairs)))
    assert out.status == "diverges"
    (s,) = out.findings
    assert s.module == pairs.items[5].pair.component and s.kind == "rows"
    assert [(r.request, r.position) for r in s.rows] == [(0, 7)] and s.error_ratio < 2.0
    assert "diverges at 1 of 12 rows (request 0 token 7" in s.evidence
    assert compose(Evidence(SPEC, outcomes=[run_check(ModuleCheck(), Evidence(SPEC, ranking=ranking)), out])
                   ).verdict == "divergent"


def test_a_row_off_at_one_module_only_is_noise_not_a_finding():
    pairs, classes = aligned_pairs(None)
    _row_bug(pairs, 5, row=7, factor=6.0, persist=False)
    ranking = analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    assert RowCheck().run(Evidence(SPEC, ranking=ranking, aligned=FakeAligned(pairs))).status == "agrees"


def test_a_clean_run_has_no_row_finding_and_reports_its_statistic_under_the_noise_bound():
    pairs, classes = aligned_pairs(None)
    ranking = analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    out = RowCheck().run(Evidence(SPEC, ranking=ranking, aligned=FakeAligned(pairs)))
    assert out.status == "agrees" and out.record.statistic is not None and out.record.statistic < ROW_NOISE


def test_the_row_check_leaves_a_pooled_divergence_to_the_module_check():
    pairs, classes = aligned_pairs("model.layers.1.mlp")
    ranking = analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    assert ranking.suspects
    assert RowCheck().run(Evidence(SPEC, ranking=ranking)).status == "skipped"


def test_a_rows_finding_is_rendered_with_its_rows_on_every_surface():
    from ekka_core.contracts.report import RunMeta
    from ekka_core.report import build_report, render_html, render_markdown

    pairs, classes = aligned_pairs(None)
    _row_bug(pairs, 5, row=7, factor=5.0)
    ranking = analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    ev = Evidence(SPEC, ranking=ranking, aligned=FakeAligned(pairs))
    ev.outcomes += [run_check(ModuleCheck(), ev), RowCheck().run(ev)]
    composed = conclude(ev, ranking)
    report = build_report(ranking, spec=SPEC, meta=RunMeta(), missing=composed.missing,
                          checks=[o.record for o in ev.outcomes])
    top = report.suspects[0]
    assert report.verdict == "divergent" and top.kind == "rows"
    assert top.summary.startswith("diverges at 1 row(s) (request 0 token 7)")
    assert top.summary in render_markdown(report)
    page = render_html(report)
    assert top.summary in page and "outlined: positions 7, named by a finding" in page
    assert page.count("outline:2px solid") == len(report.plots.heatmap.layers)


def test_the_zoo_tests_every_pair_compared_assert_fails_on_a_dropped_pair():
    """The assert the zoo diagnoses make (tests/pipeline/test_zoo_diagnoses.py, tests/agent/test_agent_zoo.py) can
    fail: a pair whose alignment failed is caught; the old comparison with the bare words never matched it."""
    from ekka_core.contracts.alignment import AlignmentFailure
    from ekka_core.contracts.report import RunMeta
    from ekka_core.report import build_report
    from hand_made import alignment_failures

    pairs, classes = aligned_pairs(None)
    pairs.failures.append(AlignmentFailure("model.layers.1.mlp", "shapes differ after alignment"))
    ranking = analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    report = build_report(ranking, spec=SPEC, meta=RunMeta())
    assert [u.module for u in alignment_failures(report)] == ["model.layers.1.mlp"]
    assert [u for u in report.unchecked if u.reason == "alignment failed"] == []      # the old, never-failing form
    pairs.failures.clear()
    clean = build_report(analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8]),
                         spec=SPEC, meta=RunMeta())
    assert alignment_failures(clean) == []
