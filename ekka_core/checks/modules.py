"""The traced module comparison: tree → mapping (rules, then knowledge base / agent) → align → analysis on one
set of traces, and what it means for the verdict.

A comparison that compared no pair has not looked at the engine, and one that could not align the stream that
carries the output (a decoder layer's output, the final norm, the logits) has not seen what reaches it: both are
``inconclusive`` (what was left unchecked says why), never ``consistent``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ekka_core.agent import AgentConfig, AgentOutcome, complete_mapping
from ekka_core.align import AlignedPairs, Traces, align
from ekka_core.analysis import analyse
from ekka_core.capture.trace import Trace
from ekka_core.checks.base import ComparisonCheck, Evidence
from ekka_core.contracts.alignment import ALIGNMENT_FAILED
from ekka_core.contracts.checks import CheckOutcome
from ekka_core.contracts.ranking import Ranking
from ekka_core.contracts.report import CheckRecord, EngineInfo, Unchecked
from ekka_core.mapping import Mapping, map_components, rules_enabled
from ekka_core.tree import build_tree, call_site, forward_span

NAME = "modules"
# The modules that carry the output: the embedding, each decoder layer's output (the residual stream), the final
# norm and the logits. A comparison that could not align one of them has not seen what reaches the output.
OUTPUT_PATH = re.compile(r"(^|\.)(embed_tokens|layers\.\d+|norm|final_layernorm|lm_head|logits_processor)$")

Progress = Callable[[str, str], None]   # (stage, message)


@dataclass
class Comparison:
    ranking: Ranking
    aligned: AlignedPairs
    agent: AgentOutcome
    tree: Any                 # the target's ModelTree


def compare_modules(target: Trace, reference: Trace, reference_fp32: Trace, *, threshold: float, out_dir: Path,
                    environ: dict[str, str], agent_config: AgentConfig | None, progress: Progress,
                    name: str = "") -> Comparison:
    progress("tree", "building model trees")
    t_tree, r_tree = build_tree(target), build_tree(reference)
    progress("mapping", "mapping components")
    mapping = map_components(t_tree, r_tree, rules=rules_enabled(environ))
    traces = Traces(target, reference, reference_fp32)
    # What the rules left with "no rule": knowledge base first ($0), then the agent if a key is set. Never
    # raises. A session that calls the API leaves its transcript next to the report.
    agent = complete_mapping(mapping, t_tree, r_tree, traces=traces,
                             config=agent_config if agent_config is not None else AgentConfig.from_env(environ),
                             transcript_dir=out_dir)
    if agent.status != "nothing-to-do":
        progress("mapping", agent.summary())
    mapping.save(out_dir / (f"mapping-{name}.json" if name else "mapping.json"))
    progress("align", "aligning activations and proving the alignment")
    aligned = align(mapping, traces)
    progress("analysis", "computing error ratios and the first divergence")
    classes = target_classes(target, t_tree)
    unchecked = [Unchecked(u.module, u.reason) for u in mapping.unmapped]
    dtype = target.run.dtype.removeprefix("torch.")
    entered = {m: calls[0].entered_after for m, calls in target.by_module().items()}

    def locate(owner: str, child_from: str, child_to: str) -> tuple[str, int, int] | None:
        c = classes.get(owner)
        return forward_span(c["cls"], c["qualname"], c["file"], child_from, child_to) if c else None

    ranking = analyse(aligned, threshold=threshold, dtype=dtype, target_classes=classes,
                      prompt_lens=target.run.prompt_lens, unchecked=unchecked, entered=entered, locate=locate)
    for suspect in ranking.suspects:
        site = call_site(t_tree, suspect.module)
        if site:
            suspect.call_file, suspect.call_line = site
    for (seq, pos), (_, why) in sorted(aligned.excluded.items()):
        ranking.notes.append(f"prompt {seq}, token {pos} excluded from there on — {why}")
    ranking.notes += read_off_the_trace(mapping, target)
    cached = [n for n in target.run.cached_tokens if n]
    if cached:
        ranking.notes.append("positions served from the prefix cache were not computed for their request and "
                             "are not compared: " + ", ".join(
                                 f"request {s}: tokens 0–{n - 1}" for s, n in enumerate(target.run.cached_tokens)
                                 if n))
    return Comparison(ranking, aligned, agent, t_tree)


class ModuleCheck(ComparisonCheck):
    name = NAME
    judges_an_empty_comparison = True

    def judge(self, ranking: Ranking, evidence: Evidence) -> CheckOutcome:
        n = len(ranking.pairs)
        if n == 0:
            why = "; ".join(sorted({u.reason for u in ranking.unchecked})[:3]) or "no component was mapped"
            return CheckOutcome(CheckRecord(NAME, "inconclusive", "no component pair was compared", compared=0,
                                            missing=[f"no module was compared ({why}): map the components — turn the "
                                                     "mapping rules on, or set ANTHROPIC_API_KEY for the mapping "
                                                     "agent"]))
        if ranking.suspects:
            s = ranking.suspects[0]
            return CheckOutcome(CheckRecord(NAME, "diverges", f"{s.module} ({s.cls}) departs first, of {n} compared",
                                            compared=n), findings=list(ranking.suspects))
        on_path = [u for u in ranking.unchecked
                   if u.reason.startswith(ALIGNMENT_FAILED) and OUTPUT_PATH.search(u.module)]
        if on_path:
            names = ", ".join(u.module for u in on_path[:3]) + (" …" if len(on_path) > 3 else "")
            return CheckOutcome(CheckRecord(
                NAME, "inconclusive", f"{n} component pairs within noise, but the stream that carries the output "
                                      f"could not be aligned at {len(on_path)} module(s)", compared=n,
                missing=[f"the residual stream was not compared at {names} (alignment failed: see Not checked): "
                         f"a divergence there or after it would go unseen — report the aligner failure, or map "
                         f"the module with an aligner that passes its self-checks"]))
        return CheckOutcome(CheckRecord(NAME, "agrees", f"{n} component pairs within numerical noise", compared=n))


def target_classes(target: Trace, tree: Any) -> dict[str, dict[str, Any]]:
    """Class and source of every target module: those that ran (the tree) and those whose hooks never fire (a model
    wrapped by vLLM's compile decorator), which can still own the code between two children."""
    classes = {n: {"cls": c[0], "qualname": c[1], "file": c[2], "line": c[3], "forward_file": c[4],
                   "forward_line": c[5]} for n, c in target.run.module_classes.items()}
    classes.update({n: {"cls": m.cls, "qualname": m.qualname, "file": m.class_file, "line": m.class_line,
                        "forward_file": m.forward_file, "forward_line": m.forward_line}
                    for n, m in tree.modules.items()})
    return classes


def describe(trace: Trace) -> EngineInfo:
    r = trace.run
    return EngineInfo(framework=r.framework, version=r.framework_version, dtype=r.dtype,
                      attn_implementation=r.attn_implementation, engine_args=r.engine_args,
                      resolved_config=r.resolved_config, config_changes=r.config_changes)


def read_off_the_trace(mapping: Mapping, target: Trace) -> list[str]:
    """What the comparison took from the run's own tensors rather than from a declaration, said in the report: a
    user reading a verdict should know what Ekka assumed of the engine's conventions."""
    notes = []
    if not target.stream_summed:
        notes.append("the engine's decoder layers return the residual stream itself, not (delta, residual) — read "
                     "off the trace (the final norm's output fits the stream): compared as it is")
    if target.embedding_scale is not None:
        name, factor = target.embedding_scale
        notes.append(f"the engine multiplies the output of {name} by {factor:.4g} in its parent's forward — measured "
                     "on the trace (no declaration says so): applied to that pair")
    subtracted = [p.component for p in mapping.pairs
                  if p.reference.minus_input is not None or p.target.minus_input is not None]
    if subtracted:
        shown = ", ".join(subtracted[:3]) + (f" and {len(subtracted) - 3} more" if len(subtracted) > 3 else "")
        notes.append(f"a residual added inside the block on one side only (observed on the trace), subtracted before "
                     f"comparing, on {len(subtracted)} pairs — {shown}")
    return notes

