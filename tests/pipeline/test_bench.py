"""The benchmark's CI subset through the real CLI: every case's expected component at rank 1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ekka_core import bench, bugs

pytestmark = pytest.mark.slow


def test_fast_subset_meets_every_case_criterion(zoo_dir, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ekka_core.cli", "bench", "--fast", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "bench.json").read_text())
    assert [c["case"] for c in summary["cases"]] == bench.FAST_SUBSET
    for case in summary["cases"]:
        if case["kind"] == "negative":
            assert case["passed"] and case["verdict"] == case["expected"], case
            continue
        bug = bugs.get(case["case"])
        assert case["passed"] and case["verdict"] == bug.expected_verdict, case
        if bug.expected_verdict == "divergent":
            assert case["rank"] is not None and case["rank"] <= bug.expected_rank, case
            assert bugs.matches(bug, case["top"]), case
        if bug.expected_culprit is not None:
            assert sorted(case["culprit"]) == sorted(bug.expected_culprit), case
    by_name = {c["case"]: c for c in summary["cases"]}
    # the served-feature case proves its point: the traced baseline alone is clean
    prefix = json.loads((tmp_path / "prefix-cache-hit-corrupts-resumed-prefill" / "report.json").read_text())
    assert prefix["serving"]["traced"]["diverges"] is False and prefix["serving"]["served"]["diverges"] is True
    assert prefix["serving"]["triage"]["traced_under"] == ["prefix_caching"]
    assert by_name["granite-embedding-multiplier-skipped"]["top"] == "model"
    # vLLM's defaults on a clean model: compiled, prefix caching on and hit, prompts split into 64-token chunks —
    # and consistent, served and traced.
    defaults = json.loads((tmp_path / "negative-clean-llama-served-defaults" / "report.json").read_text())
    resolved = defaults["serving"]["served_resolved"]
    assert resolved["compilation_mode"] != 0 and not resolved["enforce_eager"], resolved
    assert resolved["enable_prefix_caching"] and resolved["max_num_batched_tokens"] == 64, resolved
    assert defaults["serving"]["served"]["cached_tokens"] > 0 and defaults["serving"]["served"]["diverges"] is False
    assert defaults["verdict"] == "consistent"
    # a module wrong on one row, its pooled ratio under the threshold; an fp16 overflow, the first NaN/Inf module
    rows = json.loads((tmp_path / "first-decode-step-context-short" / "report.json").read_text())["suspects"][0]
    assert rows["kind"] == "rows" and rows["rows"] and rows["error_ratio"] < 2.0, rows
    nan = json.loads((tmp_path / "mlp-fp16-overflow-prescaled-down-proj" / "report.json").read_text())["suspects"][0]
    assert nan["kind"] == "non-finite" and nan["non_finite"] > 0 and nan["rows"], nan
    # a compile-only bug: clean under enforce_eager in the same diagnosis, found inside the compiled graph — the
    # module, the graph node's source line and the decomposition named
    compiled = json.loads((tmp_path / "inductor-silu-decomposition-wrong" / "report.json").read_text())
    assert compiled["serving"]["traced_args"]["enforce_eager"] and compiled["serving"]["traced"]["diverges"] is False
    top = compiled["suspects"][0]
    assert top["kind"] == "compiled" and top["target"]["module"] == "model.layers.0.mlp.act_fn", top
    assert top["compiler_stages"][0]["name"] == "aten.silu.default", top
    assert any(n["file"].endswith("vllm/model_executor/layers/activation.py") and n["line"] for n in top["graph_nodes"])
    assert compiled["graph"]["suspect"]["departs"] and [c for c in compiled["checks"] if c["check"] == "graph"][0][
        "status"] == "diverges"
    assert "cases meeting their own criteria 8/8 · negatives right 1/1" in (tmp_path / "bench.md").read_text()


def test_every_benchmark_case_cites_its_source_and_has_a_zoo_model():
    from ekka_core.zoo import known_architectures, sweep

    cases = [b for b in bugs.BUGS.values() if b.benchmark]
    assert len(cases) >= 10
    for bug in cases:
        assert bug.source.startswith("https://github.com/"), bug.name
        # a zoo architecture, or one the architecture sweep generates from the HF config class
        assert bug.arch in known_architectures() or (bug.arch.startswith("sweep:") and any(
            c.model_type == bug.arch.removeprefix("sweep:") for c in sweep.included())), bug.name
