"""``ekka bench``: the public benchmark of real historical silent errors, re-injected into vLLM-CPU.

Each bug case (``ekka_core.bugs.BUGS``) builds its tiny zoo model, diagnoses it with the bug injected through
Ekka's vLLM plugin, and scores the rank of the expected component among the suspects (pass@k: it is within the
top k). Negative controls: a clean run must be ``consistent``; a harness that drops BOS must be ``inputs-differ``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ekka_core import bugs
from ekka_core.contracts.errors import EkkaError
from ekka_core.pipeline import diagnose
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.zoo import build_model, tokenizer_without_bos

# What CI runs (tests/pipeline/test_bench.py): cases the other end-to-end tests do not already diagnose.
FAST_SUBSET = ["qwen3-qk-norm-across-heads", "llama-gptj-style-rotary", "qwen3-moe-experts-wrong-activation",
               "mistral-lm-head-wrongly-tied"]


@dataclass
class CaseResult:
    case: str
    kind: str                 # "bug" | "negative"
    expected: str
    verdict: str
    rank: int | None          # rank of the expected component (bugs); None when absent
    top: str | None
    passed_at_1: bool
    passed_at_3: bool
    seconds: float
    error: str | None = None


def case_names() -> list[str]:
    return [b.name for b in bugs.BUGS.values() if b.benchmark] + ["negative:clean-gemma3_text", "negative:clean-qwen3_moe", "negative:bos-dropped-gemma"]


def run_case(name: str, out_root: Path, max_new_tokens: int = 4) -> CaseResult:
    t0 = time.perf_counter()
    out = out_root / name.replace(":", "-")
    try:
        if name.startswith("negative:"):
            return _negative(name, out, max_new_tokens, t0)
        bug = bugs.get(name)
        model = build_model(bug.arch, overrides=bug.zoo_overrides or None)
        spec = DiagnosisSpec(model=str(model), prompts=bug.prompts or bugs.DEFAULT_PROMPTS, dtype=bug.dtype,
                             max_new_tokens=max_new_tokens)
        report = diagnose(spec, out, env={bugs.ENV_VAR: bug.name}, fresh=True).report
        rank = next((s["rank"] for s in report["suspects"] if bugs.matches(bug, s["target"]["module"])), None)
        top = report["suspects"][0]["target"]["module"] if report["suspects"] else None
        return CaseResult(name, "bug", bug.expected, report["verdict"], rank, top, rank == 1,
                          rank is not None and rank <= 3, time.perf_counter() - t0)
    except EkkaError as e:
        return CaseResult(name, "negative" if name.startswith("negative:") else "bug", "?", "error", None, None,
                          False, False, time.perf_counter() - t0, str(e))


def _negative(name: str, out: Path, max_new_tokens: int, t0: float) -> CaseResult:
    kind = name.split(":", 1)[1]
    if kind.startswith("clean-"):
        arch, expected = kind.removeprefix("clean-"), "consistent"
        spec = DiagnosisSpec(model=str(build_model(arch)), prompts=bugs.DEFAULT_PROMPTS, max_new_tokens=max_new_tokens)
    elif kind == "bos-dropped-gemma":
        model = build_model("gemma")
        expected = "inputs-differ"
        spec = DiagnosisSpec(model=str(model), prompts=bugs.DEFAULT_PROMPTS, max_new_tokens=max_new_tokens,
                             engine_args={"tokenizer": str(tokenizer_without_bos(model))})
    else:
        raise EkkaError(f"unknown negative control {name}")
    report = diagnose(spec, out, fresh=True).report
    ok = report["verdict"] == expected
    top = report["suspects"][0]["target"]["module"] if report["suspects"] else None
    return CaseResult(name, "negative", expected, report["verdict"], None, top, ok, ok, time.perf_counter() - t0)


def run_bench(names: list[str], out_root: Path, *, on_result: Callable[[CaseResult], None] = lambda r: None
              ) -> dict:
    results = []
    for name in names:
        r = run_case(name, out_root)
        results.append(r)
        on_result(r)
    bug_rows = [r for r in results if r.kind == "bug"]
    neg_rows = [r for r in results if r.kind == "negative"]
    return {
        "cases": [asdict(r) for r in results],
        "pass@1": sum(r.passed_at_1 for r in bug_rows) / len(bug_rows) if bug_rows else None,
        "pass@3": sum(r.passed_at_3 for r in bug_rows) / len(bug_rows) if bug_rows else None,
        "negatives_right": f"{sum(r.passed_at_1 for r in neg_rows)}/{len(neg_rows)}",
        "median_seconds": statistics.median(r.seconds for r in results) if results else None,
    }


def markdown_table(summary: dict) -> str:
    lines = ["| case | expected | verdict | rank | rank-1 suspect | s |", "|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        expected = c["expected"].strip("^$").replace("\\.", ".")   # the regex, read as a module path
        lines.append(f"| {c['case']} | `{expected}` | {c['verdict']} | {c['rank'] or '—'} | "
                     f"`{c['top'] or '—'}` | {c['seconds']:.0f} |")
    p1 = "—" if summary["pass@1"] is None else f"{summary['pass@1']:.0%}"
    p3 = "—" if summary["pass@3"] is None else f"{summary['pass@3']:.0%}"
    lines.append("")
    lines.append(f"pass@1 {p1} · pass@3 {p3} · negatives right {summary['negatives_right']} · "
                 f"median {summary['median_seconds']:.0f} s per case")
    return "\n".join(lines)
