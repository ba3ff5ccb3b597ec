"""Fault injection: every way a diagnosis can fail to observe what a verdict needs gives ``inconclusive`` or the
right finding — never ``consistent`` — and says why in report.json, the CLI summary and report.html (the editor's
view of the same report is the e2e test's)."""

from __future__ import annotations

import json

import pytest

from ekka_core.analysis import analyse
from ekka_core.checks import AFTER_COMPARISON, Evidence, conclude, run_check
from ekka_core.checks import non_finite as non_finite_module
from ekka_core.checks.modules import ModuleCheck
from ekka_core.cli import _print_report
from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.ranking import Ranking
from ekka_core.contracts.report import EXIT_CODES, RunMeta, ServingSection, Unchecked
from ekka_core.contracts.serving import Trial
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.report import build_report, render_html
from ekka_core.symptom import check_symptom
from ekka_core.triage import triage

from hand_made import SPEC, TOKENS, FakeAligned, aligned_pairs, symptom_run


def _report(evidence: Evidence, ranking: Ranking):
    """What the pipeline's last steps do: the checks after the comparison, the composer, the report."""
    if evidence.ranking is not None:
        evidence.outcomes.append(run_check(ModuleCheck(), evidence))
        for check in AFTER_COMPARISON:
            evidence.outcomes.append(run_check(check, evidence))
    composed = conclude(evidence, ranking)
    serving = ServingSection(served=evidence.served_check, traced=evidence.traced_check, triage=evidence.triage) \
        if evidence.served_check is not None else None
    return build_report(ranking, spec=SPEC, meta=RunMeta(), serving=serving, missing=composed.missing,
                        checks=[o.record for o in evidence.outcomes])


def _clean_ranking() -> tuple[Ranking, object]:
    pairs, classes = aligned_pairs(None)
    return analyse(pairs, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8]), \
        FakeAligned(pairs)


def _no_pairs():
    ranking = Ranking("consistent", 2.0, "bfloat16",
                      unchecked=[Unchecked("model.layers.0.mlp", "no rule: the mapping rules are disabled")])
    return _report(Evidence(SPEC, ranking=ranking), ranking), "no module was compared"


def _nan_at_a_module(monkeypatch):
    pairs, classes = aligned_pairs(None)
    for it in pairs.items[7:]:
        it.target[2, 1] = float("nan")
    by_name = {it.pair.component: it for it in pairs.items}
    monkeypatch.setattr(non_finite_module, "align_pair", lambda pair, traces, order=-1: by_name[pair.component])
    ranking = analyse(pairs, threshold=2.0, dtype="float16", target_classes=classes, prompt_lens=[8])
    report = _report(Evidence(SPEC, ranking=ranking, aligned=FakeAligned(pairs)), ranking)
    assert report.suspects[0].kind == "non-finite"
    assert report.suspects[0].target.module == "model.layers.2.self_attn.attn"
    return report, "NaN/Inf output value"


def _nan_logprobs():
    outputs, scores = symptom_run([0.01, 0.01, 0.01])
    outputs.requests[0].logprobs[2][TOKENS[1]] = float("nan")
    ranking, aligned = _clean_ranking()
    ev = Evidence(SPEC, ranking=ranking, aligned=aligned, served_check=check_symptom(outputs, scores, threshold=2.0))
    return _report(ev, ranking), "NaN/Inf logprobs"


def _served_not_observed():
    outputs, scores = symptom_run([0.01, 0.01, 0.01])
    outputs.requests[0].logprobs = []
    ranking, aligned = _clean_ranking()
    ev = Evidence(SPEC, ranking=ranking, aligned=aligned, served_check=check_symptom(outputs, scores, threshold=2.0))
    return _report(ev, ranking), "returned no logprobs"


def _triage_exhausted():
    outputs, scores = symptom_run([0.01, 0.01, 0.5])
    served = check_symptom(outputs, scores, threshold=2.0, label="served configuration")
    baseline = check_symptom(*symptom_run([0.01, 0.01, 0.01]), threshold=2.0, label="traced baseline")
    factors = ["compilation", "custom_ops", "prefix_caching"]

    def run(subset):
        d = set(subset) == set(factors)
        return (served if d else baseline), Trial(subset, {}, served.ratio if d else 1.0, d)

    ranking, aligned = _clean_ranking()
    ev = Evidence(SPEC, ranking=ranking, aligned=aligned, served_check=served, traced_check=baseline,
                  triage=triage(served, baseline, {f: {} for f in factors}, {}, run, max_trials=2))
    return _report(ev, ranking), "not narrowed"


def _alignment_failure_on_output_path():
    ranking, aligned = _clean_ranking()
    ranking.unchecked.append(Unchecked("model.layers.3", "alignment failed: rows differ"))
    return _report(Evidence(SPEC, ranking=ranking, aligned=aligned), ranking), "residual stream was not compared"


FAULTS = {"no pairs": _no_pairs, "NaN at a module": _nan_at_a_module, "NaN logprobs": _nan_logprobs,
          "served not observed": _served_not_observed, "triage exhausted": _triage_exhausted,
          "alignment failure on the output path": _alignment_failure_on_output_path}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_is_never_consistent_and_says_why_on_every_surface(fault, monkeypatch, capsys, tmp_path):
    make = FAULTS[fault]
    report, why = make(monkeypatch) if "monkeypatch" in make.__code__.co_varnames else make()
    assert report.verdict in ("inconclusive", "divergent"), report.verdict
    assert EXIT_CODES[report.verdict] != 0
    assert why in json.dumps(report.to_json(), ensure_ascii=False)
    _print_report(report, {"json": tmp_path / "report.json", "html": tmp_path / "report.html"})
    assert why in capsys.readouterr().out.replace("\n", " ")
    assert why in render_html(report)


def test_the_fault_matrix_would_fail_on_a_consistent_report():
    """The matrix's own power: the same surfaces on a clean run say consistent and none of the reasons."""
    ranking, aligned = _clean_ranking()
    report = _report(Evidence(SPEC, ranking=ranking, aligned=aligned), ranking)
    assert report.verdict == "consistent" and report.missing == []
    assert not any(why in json.dumps(report.to_json()) for why in
                   ("no module was compared", "NaN/Inf output value", "NaN/Inf logprobs", "returned no logprobs", "not narrowed",
                    "residual stream was not compared"))


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), 1e300, 1.0, 0.5])
def test_a_threshold_that_cannot_judge_is_bad_input(threshold, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(BadInput, match="threshold"):
        DiagnosisSpec(model=str(model), prompts=["x"], threshold=threshold).validate()


def test_an_engine_argument_naming_another_checkpoint_is_refused(tmp_path):
    with pytest.raises(BadInput) as e:
        DiagnosisSpec(model=str(tmp_path), prompts=["x"], engine_args={"model": "/other"}).validate()
    assert "--model" in e.value.fix


def test_out_naming_an_existing_file_is_bad_input_exit_2(tmp_path, capsys):
    from ekka_core.cli import main
    from ekka_core.zoo import build_model

    out = tmp_path / "report-here.txt"
    out.write_text("keep me")
    code = main(["diagnose", "--model", str(build_model("llama")), "--prompt", "hi", "--out", str(out)])
    assert code == 2 and out.read_text() == "keep me"
    assert "is a file, not a directory" in capsys.readouterr().err


@pytest.mark.slow
def test_nothing_compared_end_to_end_is_inconclusive_exit_4(tmp_path, monkeypatch, capsys):
    """Real vLLM and HF, mapping rules and knowledge base off and no API key: every component is left for the
    agent, which cannot run — nothing is compared, so the diagnosis cannot say consistent."""
    from ekka_core.cli import main
    from ekka_core.zoo import build_model

    monkeypatch.setenv("EKKA_MAPPING_RULES", "off")
    monkeypatch.setenv("EKKA_KNOWLEDGE_BASE", "off")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code = main(["diagnose", "--model", str(build_model("llama")), "--prompt", "The capital of France is",
                 "--max-new-tokens", "2", "--engine-arg", "enforce_eager=true", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out.replace("\n", " ")
    assert code == 4
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "inconclusive" and report["checked"] == 0
    assert any("no module was compared" in m for m in report["missing"])
    assert "inconclusive: no module was compared" in printed
    assert "no module was compared" in (tmp_path / "out" / "report.html").read_text()


def test_a_traced_only_finding_says_so_and_one_run_does_not_after_a_json_round_trip():
    from ekka_core.contracts.report import Report, Suspect, TargetLocation, headline
    from ekka_core.contracts.serving import SymptomCheck

    one = SymptomCheck("served configuration (= the traced baseline: one run)", 1.0, False, 2.0)
    report = Report(verdict="divergent", suspects=[Suspect(rank=1, target=TargetLocation("m", "X"), error_ratio=9.0)],
                    serving=ServingSection(served=one, traced=one))
    assert "traced baseline only" not in headline(Report.from_json(report.to_json()))
    report.serving.traced = SymptomCheck("traced baseline", 9.0, True, 2.0)
    assert "in the traced baseline only: the served configuration matches" in headline(report)
