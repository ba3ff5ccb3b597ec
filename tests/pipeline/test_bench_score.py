"""``bench.score`` over hand-made reports (no engine): the rank of the expected component among the suspects and
then the departures from the reference's rounding, the verdict, and the culprit triage names."""

from __future__ import annotations

from ekka_core import bench, bugs
from ekka_core.contracts.report import Report, RowFinding, ServingSection, Suspect, TargetLocation
from ekka_core.contracts.serving import SymptomCheck, Triage


def _suspect(rank: int, module: str, evidence: str = "") -> Suspect:
    return Suspect(rank=rank, target=TargetLocation(module=module, cls="X"), evidence=evidence)


def test_score_ranks_the_expected_component_among_suspects_then_conventions() -> None:
    bug = bugs.get("qwen3-qk-norm-across-heads")
    report = Report(verdict="divergent", suspects=[_suspect(1, "model.layers.0.self_attn")],
                    conventions=[_suspect(2, "model.layers.0.self_attn.q_norm")])
    r = bench.score(bug, report, 1.0)
    assert (r.rank, r.top, r.verdict) == (2, "model.layers.0.self_attn", "divergent")
    assert not r.passed_at_1 and r.passed_at_3 and not r.passed          # the case wants rank 1
    wrong = bench.score(bug, Report(verdict="consistent"), 1.0)
    assert wrong.rank is None and not wrong.passed
    assert "verdict consistent, expected divergent" in wrong.why and "not among the suspects" in wrong.why


def test_score_checks_the_culprit_triage_names() -> None:
    bug = bugs.get("prefix-cache-hit-corrupts-resumed-prefill")
    check = SymptomCheck(label="served", ratio=9.0, diverges=True, threshold=2.0)
    report = Report(verdict="divergent", suspects=[_suspect(1, "model.layers.0.self_attn.attn")],
                    serving=ServingSection(served=check,
                                           triage=Triage(served=check, baseline=check, culprit=["prefix_caching"])))
    r = bench.score(bug, report, 1.0)
    assert r.passed and r.passed_at_1 and r.culprit == ["prefix_caching"]
    report.serving.triage.culprit = ["batching"]
    r = bench.score(bug, report, 1.0)
    assert not r.passed and "culprit ['batching'], expected ['prefix_caching']" in r.why


def test_markdown_table_reads_the_summarys_case_rows() -> None:
    from dataclasses import asdict

    ok = bench.CaseResult("a-bug", "bug", "^model\\.norm$", "divergent", 1, "model.norm", True, True, 12.0,
                          culprit=["batching"], passed=True)
    bad = bench.CaseResult("negative:x", "negative", "consistent", "divergent", None, None, False, False, 8.0,
                           passed=False, why="verdict divergent")
    summary = {"cases": [asdict(ok), asdict(bad)], "pass@1": 1.0, "pass@3": 1.0, "cases_passed": "1/1",
               "negatives_right": "0/1", "median_seconds": 10.0}
    table = bench.markdown_table(summary)
    assert "| a-bug | `model.norm` | divergent | 1 | batching | `model.norm` | 12 |" in table
    assert "| negative:x ✗ | `consistent` | divergent | — | — | `—` | 8 |" in table
    assert "- ✗ negative:x: verdict divergent" in table and "pass@1 100%" in table


def _rows_suspect(ratio: float | None, rows: list[RowFinding], kind: str = "rows") -> Suspect:
    return Suspect(rank=1, target=TargetLocation(module="model.layers.0.input_layernorm", cls="RMSNorm"), kind=kind,
                   error_ratio=ratio, rows=rows)


def test_score_a_rows_case_needs_a_rows_suspect_under_the_threshold_that_names_rows() -> None:
    bug = bugs.get("rmsnorm-tail-rows-wrong")
    assert bug.expected_kind == "rows"
    rows = [RowFinding(0, 208, 4.7), RowFinding(0, 209, 3.5)]
    ok = bench.score(bug, Report(verdict="divergent", suspects=[_rows_suspect(1.47, rows)]), 1.0)
    assert ok.passed and ok.passed_at_1 and ok.rank == 1 and ok.why == ""
    # the pooled ratio at the threshold: the pooled comparison could have seen it, the case proves nothing
    over = bench.score(bug, Report(verdict="divergent", threshold=2.0, suspects=[_rows_suspect(2.0, rows)]), 1.0)
    assert not over.passed and over.rank is None and "not under the threshold 2.0" in over.why
    assert "not among the suspects" not in over.why
    unnamed = bench.score(bug, Report(verdict="divergent", suspects=[_rows_suspect(1.47, [])]), 1.0)
    assert not unnamed.passed and "without the rows named" in unnamed.why
    module = bench.score(bug, Report(verdict="divergent", suspects=[_rows_suspect(1.47, rows, kind="module")]), 1.0)
    assert not module.passed and "as a module suspect, expected rows" in module.why
    # a report with a looser threshold judges by its own
    loose = bench.score(bug, Report(verdict="divergent", threshold=2.5, suspects=[_rows_suspect(2.2, rows)]), 1.0)
    assert loose.passed


def test_score_a_rows_case_takes_the_first_matching_suspect_that_meets_its_kind() -> None:
    bug = bugs.get("first-decode-step-context-short")
    rows = [RowFinding(0, 34, 6.6)]
    attn = "model.layers.0.self_attn.attn"
    report = Report(verdict="divergent",
                    suspects=[Suspect(rank=1, target=TargetLocation(module="model.norm", cls="RMSNorm"), kind="rows",
                                      error_ratio=1.2, rows=[RowFinding(0, 3, 3.0)]),
                              Suspect(rank=2, target=TargetLocation(module=attn, cls="Attention"), kind="rows",
                                      error_ratio=1.58, rows=rows)])
    r = bench.score(bug, report, 1.0)
    assert r.rank == 2 and r.passed and not r.passed_at_1 and r.passed_at_3      # expected_rank 3


def test_score_a_non_finite_case_needs_nan_inf_counted() -> None:
    bug = bugs.get("mlp-fp16-overflow-prescaled-down-proj")
    assert bug.expected_kind == "non-finite" and bug.dtype == "float16"

    def report(kind: str, count: int) -> Report:
        return Report(verdict="divergent", suspects=[Suspect(
            rank=1, target=TargetLocation(module="model.layers.0.mlp.down_proj", cls="RowParallelLinear"), kind=kind,
            error_ratio=1e9, rows=[RowFinding(0, 1, 1e9)], non_finite=count)])

    ok = bench.score(bug, report("non-finite", 768), 1.0)
    assert ok.passed and ok.passed_at_1
    none_counted = bench.score(bug, report("non-finite", 0), 1.0)
    assert not none_counted.passed and "without NaN/Inf values counted" in none_counted.why
    as_module = bench.score(bug, report("module", 768), 1.0)
    assert not as_module.passed and "as a module suspect, expected non-finite" in as_module.why


def test_score_a_case_without_an_expected_kind_takes_any_kind() -> None:
    bug = bugs.get("qwen3-qk-norm-across-heads")
    assert bug.expected_kind == ""
    s = Suspect(rank=1, target=TargetLocation(module="model.layers.0.self_attn.q_norm", cls="X"), kind="rows",
                error_ratio=5.0)
    assert bench.score(bug, Report(verdict="divergent", suspects=[s]), 1.0).passed
