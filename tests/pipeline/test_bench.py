"""The benchmark's CI subset through the real CLI: every case's expected component at rank 1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ekka_core import bench, bugs

pytestmark = pytest.mark.slow


def test_fast_subset_ranks_every_expected_component_first(zoo_dir, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ekka_core.cli", "bench", "--fast", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "bench.json").read_text())
    assert [c["case"] for c in summary["cases"]] == bench.FAST_SUBSET
    for case in summary["cases"]:
        assert case["verdict"] == "divergent" and case["rank"] == 1, case
        assert bugs.matches(bugs.get(case["case"]), case["top"])
    assert summary["pass@1"] == 1.0
    assert "pass@1 100%" in (tmp_path / "bench.md").read_text()


def test_every_benchmark_case_cites_its_source_and_has_a_zoo_model():
    from ekka_core.zoo import known_architectures

    cases = [b for b in bugs.BUGS.values() if b.benchmark]
    assert len(cases) >= 10
    for bug in cases:
        assert bug.source.startswith("https://github.com/"), bug.name
        assert bug.arch in known_architectures()
