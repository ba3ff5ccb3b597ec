"""One diagnosis, end to end: capture → tree → mapping → align → analysis → report.

The shells (CLI, language server) call :func:`diagnose` and nothing else.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ekka_core import __version__
from ekka_core.agent import AgentConfig, AgentOutcome, complete_mapping
from ekka_core.align import Traces, align
from ekka_core.analysis import Ranking, analyse
from ekka_core.capture import capture, load
from ekka_core.capture.trace import Trace
from ekka_core.mapping import map_components, rules_enabled
from ekka_core.report import build_report, write_report
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.tree import build_tree, call_site

Progress = Callable[[str, str], None]   # (stage, message)


@dataclass
class Diagnosis:
    report: dict[str, Any]
    paths: dict[str, Path]


def diagnose(spec: DiagnosisSpec, out_dir: Path, *, fresh: bool = False,
             progress: Progress = lambda stage, msg: None, env: dict[str, str] | None = None,
             agent_config: AgentConfig | None = None) -> Diagnosis:
    """``env`` adds to the environment the engines and the stages read (EKKA_INJECT_BUG, EKKA_MAPPING_RULES,
    ANTHROPIC_API_KEY, …); ``agent_config`` replaces the agent's configuration read from it."""
    spec.validate()
    environ = {**os.environ, **(env or {})}
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    captured = capture(spec, out_dir, fresh=fresh, progress=lambda m: progress("capture", m), env=env)
    target, reference, reference_fp32 = load(captured)
    meta = {"ekka_version": __version__, "target": _describe(target), "reference": _describe(reference),
            "traces": str(captured.target.parent), "reused_traces": captured.reused}

    differ = preflight_inputs(target, reference)
    if differ:
        ranking = Ranking(verdict="inputs-differ", threshold=spec.threshold, dtype=spec.dtype,
                          inputs_differ=differ, prompt_lens=target.run.prompt_lens)
        ranking.notes.append("the token ids differ before the model runs: fix the tokenisation (BOS, chat "
                             "template, special tokens) and diagnose again")
        return _finish(ranking, spec, meta, out_dir, t0, progress)

    progress("tree", "building model trees")
    t_tree, r_tree = build_tree(target), build_tree(reference)
    progress("mapping", "mapping components")
    mapping = map_components(t_tree, r_tree, rules=rules_enabled(environ))
    traces = Traces(target, reference, reference_fp32)
    # What the rules left with "no rule": knowledge base first ($0), then the agent if a key is set. Never raises.
    # A session that calls the API leaves its transcript next to the report.
    agent = complete_mapping(mapping, t_tree, r_tree, traces=traces,
                             config=agent_config if agent_config is not None else AgentConfig.from_env(environ),
                             transcript_dir=out_dir)
    if agent.status != "nothing-to-do":
        progress("mapping", agent.summary())
    mapping.save(out_dir / "mapping.json")
    progress("align", "aligning activations and proving the alignment")
    aligned = align(mapping, traces)
    progress("analysis", "computing error ratios and the first divergence")
    classes = {name: {"cls": n.cls, "file": n.class_file, "line": n.class_line, "forward_file": n.forward_file,
                      "forward_line": n.forward_line} for name, n in t_tree.modules.items()}
    unchecked = [{"module": u.module, "reason": u.reason} for u in mapping.unmapped]
    ranking = analyse(aligned, threshold=spec.threshold, dtype=spec.dtype, target_classes=classes,
                      prompt_lens=target.run.prompt_lens, unchecked=unchecked)
    for suspect in ranking.suspects:
        site = call_site(t_tree, suspect.module)
        if site:
            suspect.call_file, suspect.call_line = site
    for (seq, pos), (_, why) in sorted(aligned.excluded.items()):
        ranking.notes.append(f"prompt {seq}, token {pos} excluded from there on — {why}")
    return _finish(ranking, spec, meta, out_dir, t0, progress, agent)


def _finish(ranking: Ranking, spec: DiagnosisSpec, meta: dict[str, Any], out_dir: Path, t0: float,
            progress: Progress, agent: AgentOutcome | None = None) -> Diagnosis:
    progress("report", "writing report.json, report.md, report.html")
    meta["seconds"] = round(time.perf_counter() - t0, 2)
    report = build_report(ranking, spec=spec.to_json(), meta=meta)
    if agent is not None:
        report["agent"] = agent.to_json()
    return Diagnosis(report, write_report(report, out_dir))


def preflight_inputs(target: Trace, reference: Trace) -> list[dict[str, Any]]:
    """Token ids each framework's own tokenizer gives each prompt; any difference is reported by position."""
    differ = []
    for i, (a, b) in enumerate(zip(target.run.own_prompt_token_ids, reference.run.own_prompt_token_ids)):
        if a != b:
            pos = next((j for j, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
            differ.append({"prompt": i, "position": pos, "target": a[:pos + 8], "reference": b[:pos + 8],
                           "target_len": len(a), "reference_len": len(b)})
    return differ


def _describe(trace: Trace) -> dict[str, Any]:
    r = trace.run
    return {"framework": r.framework, "version": r.framework_version, "dtype": r.dtype,
            "attn_implementation": r.attn_implementation, "engine_args": r.engine_args}
