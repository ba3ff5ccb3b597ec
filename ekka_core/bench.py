"""``ekka bench``: the public benchmark of real historical silent errors, re-injected into vLLM-CPU.

Each bug case (``ekka_core.bugs.BUGS``) builds its tiny zoo model, diagnoses it with the bug injected through
Ekka's vLLM plugin, and scores the rank of the expected component among the suspects (pass@k: it is within the
top k). Negative controls: a clean run must be ``consistent``; a harness that drops BOS must be ``inputs-differ``.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ekka_core import bugs
from ekka_core.contracts.errors import EkkaError
from ekka_core.contracts.report import Report, Suspect
from ekka_core.pipeline import diagnose
from ekka_core.contracts.spec import DiagnosisSpec, RequestSpec
from ekka_core.zoo import build_model, tokenizer_without_bos

# What CI runs (tests/pipeline/test_bench.py): one case of each kind the other end-to-end tests do not already
# diagnose — a module, code between modules, the engine's input path, a rounding convention, a served feature, a
# module wrong on a few rows, an fp16 overflow, a compile-only bug localised inside the compiled graph — and the
# negative that serves vLLM's defaults (compiled, prefix cache hit, small chunks) on a clean model.
FAST_SUBSET = ["qwen3-qk-norm-across-heads", "granite-embedding-multiplier-skipped", "chat-double-bos",
               "rmsnorm-weight-in-fp32", "prefix-cache-hit-corrupts-resumed-prefill",
               "first-decode-step-context-short", "mlp-fp16-overflow-prescaled-down-proj",
               "inductor-silu-decomposition-wrong", "negative:clean-llama-served-defaults"]


@dataclass
class CaseResult:
    case: str
    kind: str                 # "bug" | "negative"
    expected: str
    verdict: str
    rank: int | None          # rank of the expected component among suspects, then conventions (bugs)
    top: str | None
    passed_at_1: bool         # the case's criteria met with the expected component at rank 1
    passed_at_3: bool         # … within the first three
    seconds: float
    error: str | None = None
    culprit: list[str] | None = None      # what triage named (issue-16 cases)
    passed: bool = False                  # the case's own criteria (its expected rank, culprit and words)
    why: str = ""                         # what was missing when it did not pass


def case_names() -> list[str]:
    return [b.name for b in bugs.BUGS.values() if b.benchmark] + NEGATIVES


NEGATIVES = ["negative:clean-gemma3_text", "negative:clean-qwen3_moe", "negative:bos-dropped-gemma",
             "negative:clean-llama-served-defaults"]


def spec_for(bug: bugs.Bug, model: Path, max_new_tokens: int) -> DiagnosisSpec:
    """The diagnosis a user would start for this case: its inputs, its served configuration."""
    spec = DiagnosisSpec(model=str(model), dtype=bug.dtype, max_new_tokens=bug.max_new_tokens or max_new_tokens,
                         engine_args=dict(bug.engine_args))
    if bug.requests:
        spec.requests = [RequestSpec(**r) for r in bug.requests]
    elif bug.messages:
        spec.messages = list(bug.messages)
    else:
        spec.prompts = list(bug.prompts or bugs.DEFAULT_PROMPTS)
    return spec


def run_case(name: str, out_root: Path, max_new_tokens: int = 4) -> CaseResult:
    t0 = time.perf_counter()
    out = out_root / name.replace(":", "-")
    try:
        if name.startswith("negative:"):
            return _negative(name, out, max_new_tokens, t0)
        bug = bugs.get(name)
        model = build_model(bug.arch, overrides=bug.zoo_overrides or None)
        report = diagnose(spec_for(bug, model, max_new_tokens), out, env={bugs.ENV_VAR: bug.name}, fresh=True).report
        return score(bug, report, time.perf_counter() - t0)
    except EkkaError as e:
        return CaseResult(name, "negative" if name.startswith("negative:") else "bug", "?", "error", None, None,
                          False, False, time.perf_counter() - t0, str(e))


def score(bug: bugs.Bug, report: Report, seconds: float) -> CaseResult:
    """Did the diagnosis find what the case says it must: the verdict; the expected component within its rank
    (suspects first, then departures from the reference's rounding, which rank below them); the evidence's words;
    the culprit served feature; the suspect's kind (``Bug.expected_kind``)."""
    triage = report.serving.triage if report.serving else None
    culprit = triage.culprit if triage else None
    listed = report.suspects + report.conventions
    top = listed[0].target.module if listed else None
    missing = []
    rank = None
    if bug.expected_verdict != report.verdict:
        missing.append(f"verdict {report.verdict}, expected {bug.expected_verdict}")
    if bug.expected_verdict == "inputs-differ":
        ok = not missing
        return CaseResult(bug.name, "bug", "inputs-differ", report.verdict, None, top, ok, ok, seconds,
                          passed=ok, why="; ".join(missing))
    rejected = False
    for i, s in enumerate(listed, 1):
        if bugs.matches(bug, s.target.module):
            if bug.expected_words and not re.search(bug.expected_words, s.evidence):
                missing.append(f"rank {i} found without the words /{bug.expected_words}/")
                rejected = True
                continue
            unmet = _kind_unmet(bug, s, report.threshold)
            if unmet:
                missing.append(f"rank {i} found {unmet}")
                rejected = True
                continue
            rank = i
            break
    if rank is None and not rejected:
        missing.append("expected component not among the suspects")
    if bug.expected_culprit is not None and sorted(culprit or []) != sorted(bug.expected_culprit):
        missing.append(f"culprit {culprit}, expected {bug.expected_culprit}")
    if bug.expected_kind == "compiled" and (unproven := _not_clean_eager(report)):
        missing.append(unproven)
    criteria = not missing
    return CaseResult(bug.name, "bug", bug.expected, report.verdict, rank, top,
                      criteria and rank == 1, criteria and rank is not None and rank <= 3, seconds, culprit=culprit,
                      passed=criteria and rank is not None and rank <= bug.expected_rank, why="; ".join(missing))


def _not_clean_eager(report: Report) -> str | None:
    """A compile-only case proves its class only when the same diagnosis ran it eagerly and found it clean: its
    traced baseline (``enforce_eager``) matches the reference at the output level."""
    serving = report.serving
    traced = serving.traced if serving else None
    if serving is None or traced is None or not (serving.traced_args or {}).get("enforce_eager"):
        return "not run under enforce_eager in the same diagnosis"
    if traced.diverges:
        return f"diverges under enforce_eager too (ratio {traced.ratio})"
    return None


def _kind_unmet(bug: bugs.Bug, suspect: Suspect, threshold: float) -> str | None:
    """What the matching suspect lacks for the case's ``expected_kind`` (None: nothing). A ``rows`` case proves its
    point only where the pooled comparison could not see it: the module's pooled error ratio under the threshold, its
    rows named. A ``non-finite`` case needs NaN/Inf values counted; a ``compiled`` one a graph node's source line
    and the compiler stage named."""
    kind = bug.expected_kind
    if not kind:
        return None
    if suspect.kind != kind:
        return f"as a {suspect.kind} suspect, expected {kind}"
    if kind == "rows":
        if suspect.error_ratio is None or not suspect.error_ratio < threshold:
            return f"with pooled error ratio {suspect.error_ratio}, not under the threshold {threshold}"
        if not suspect.rows:
            return "without the rows named"
    if kind == "non-finite" and not suspect.non_finite > 0:
        return "without NaN/Inf values counted"
    if kind == "compiled":
        if not any(n.file and n.line for n in suspect.graph_nodes):
            return "without a graph node's source line"
        if not suspect.compiler_stages:
            return "without the compiler stage named"
    return None


def _negative(name: str, out: Path, max_new_tokens: int, t0: float) -> CaseResult:
    kind = name.split(":", 1)[1]
    if kind.startswith("clean-") and kind != "clean-llama-served-defaults":
        arch, expected = kind.removeprefix("clean-"), "consistent"
        spec = DiagnosisSpec(model=str(build_model(arch)), prompts=bugs.DEFAULT_PROMPTS, max_new_tokens=max_new_tokens)
    elif kind == "clean-llama-served-defaults":
        # vLLM's defaults (compiled, prefix caching, chunked prefill) with a small chunk budget and a second request
        # that hits the cache: every served feature is exercised, nothing is wrong.
        expected = "consistent"
        spec = DiagnosisSpec(model=str(build_model("llama")), max_new_tokens=max_new_tokens,
                             engine_args={"max_num_batched_tokens": 64},
                             requests=[RequestSpec(id="a", prompt=bugs.SHARED_PREFIX + " Question: who jumps?"),
                                       RequestSpec(id="b", prompt=bugs.SHARED_PREFIX + " Question: what boils?",
                                                   after="a")])
    elif kind == "bos-dropped-gemma":
        model = build_model("gemma")
        expected = "inputs-differ"
        spec = DiagnosisSpec(model=str(model), prompts=bugs.DEFAULT_PROMPTS, max_new_tokens=max_new_tokens,
                             engine_args={"tokenizer": str(tokenizer_without_bos(model))})
    else:
        raise EkkaError(f"unknown negative control {name}")
    report = diagnose(spec, out, fresh=True).report
    ok = report.verdict == expected
    top = report.top.target.module if report.top else None
    return CaseResult(name, "negative", expected, report.verdict, None, top, ok, ok, time.perf_counter() - t0,
                      passed=ok, why="" if ok else f"verdict {report.verdict}")


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
        "cases_passed": f"{sum(r.passed for r in bug_rows)}/{len(bug_rows)}",
        "negatives_right": f"{sum(r.passed_at_1 for r in neg_rows)}/{len(neg_rows)}",
        "median_seconds": statistics.median(r.seconds for r in results) if results else None,
    }


def markdown_table(summary: dict) -> str:
    """``summary`` as :func:`run_bench` returns it (and bench.json holds it): its ``cases`` are :class:`CaseResult`
    rows as JSON."""
    cases = [CaseResult(**c) for c in summary["cases"]]
    lines = ["| case | expected | verdict | rank | culprit | rank-1 suspect | s |", "|---|---|---|---|---|---|---|"]
    for c in cases:
        expected = c.expected.strip("^$").replace("\\.", ".")   # the regex, read as a module path
        culprit = ", ".join(c.culprit or []) or "—"
        mark = "" if c.passed else " ✗"
        lines.append(f"| {c.case}{mark} | `{expected}` | {c.verdict} | {c.rank or '—'} | {culprit} | "
                     f"`{c.top or '—'}` | {c.seconds:.0f} |")
    p1 = "—" if summary["pass@1"] is None else f"{summary['pass@1']:.0%}"
    p3 = "—" if summary["pass@3"] is None else f"{summary['pass@3']:.0%}"
    lines.append("")
    lines.append(f"pass@1 {p1} · pass@3 {p3} · cases meeting their own criteria {summary.get('cases_passed', '—')} · "
                 f"negatives right {summary['negatives_right']} · median {summary['median_seconds']:.0f} s per case")
    for c in cases:
        if not c.passed:
            lines.append(f"- ✗ {c.case}: {c.why or c.error or 'failed'}")
    return "\n".join(lines)
