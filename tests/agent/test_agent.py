"""The mapping agent (ekka_core.agent) against a local FAKE of the Anthropic Messages API (tests/support/fake_anthropic.py).

Trees are built by hand: a toy model whose target MLP holds ``fancy_proj`` (class ``WeirdLinear``) where the
reference holds ``dense_h_to_4h`` — a path no rule can connect. Traces are synthetic (written with TraceWriter) for
the tensor tools. No network, no real API, no sleeping: every back-off goes through an injected ``sleep``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

from ekka_core.agent import (DEFAULT_MODEL, REASON_NO_KEY, REASON_UNREACHABLE, AgentConfig, complete_mapping,
                             price_for)
from ekka_core.agent.budget import Budget
from ekka_core.agent.kb import SHIPPED_DIR, KnowledgeBase
from ekka_core.agent.proposals import Proposal, match
from ekka_core.agent.tensors import infer_match
from ekka_core.align import Traces, align
from ekka_core.capture.trace import ModuleCall, RunInfo, Step, Trace, TraceWriter
from ekka_core.mapping import ComponentPair, Endpoint, Mapping, map_components
from ekka_core.tree import ModelTree, ModuleNode, build_tree
from fake_anthropic import FakeAnthropic, text, tool_use

FANCY = "model.layers.0.mlp.fancy_proj"
DENSE = "model.layers.0.mlp.dense_h_to_4h"

TOY_SOURCE = '''\
import torch
from torch import nn


class WeirdLinear(nn.Module):
    """hidden -> 4*hidden, loads the checkpoint's dense_h_to_4h weight."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4 * hidden, hidden))

    def forward(self, x):
        return x @ self.weight.t()


class FusedUp(nn.Module):
    def forward(self, x):
        return x
'''


# ---------------------------------------------------------------------------------------------------------------
# fixtures and builders

@pytest.fixture
def api():
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def toy_src(tmp_path) -> Path:
    p = tmp_path / "toy_model.py"
    p.write_text(TOY_SOURCE)
    return p


def _tree(framework: str, spec: list[tuple[str, str, int | None]], src: Path) -> ModelTree:
    tree = ModelTree(framework)
    for i, (name, cls, out) in enumerate(spec):
        line = {"WeirdLinear": 5, "FusedUp": 16}.get(cls, 1)
        tree.modules[name] = ModuleNode(name, cls, f"toy_model.{cls}", str(src), line, str(src), line + 5, calls=1,
                                        first_call=i, out_features=out)
    return tree


def toy_trees(src: Path, layers: int = 1, fused: bool = False) -> tuple[ModelTree, ModelTree]:
    t: list[tuple[str, str, int | None]] = [("model.embed_tokens", "VocabParallelEmbedding", 256)]
    r: list[tuple[str, str, int | None]] = [("model.embed_tokens", "Embedding", 256)]
    for i in range(layers):
        L = f"model.layers.{i}"
        t += [(f"{L}.mlp.fancy_proj", "WeirdLinear", 1024)]
        r += [(f"{L}.mlp.dense_h_to_4h", "Linear", 1024)]
        if fused:
            t += [(f"{L}.mlp.fused_up", "FusedUp", 1536)]
            r += [(f"{L}.mlp.up_a", "Linear", 1024), (f"{L}.mlp.up_b", "Linear", 512)]
        t += [(f"{L}.mlp", "ToyMLP", 256), (L, "ToyDecoderLayer", 256)]
        r += [(f"{L}.mlp", "ToyMLP", 256), (L, "ToyDecoderLayer", 256)]
    t += [("model.norm", "RMSNorm", 256), ("logits_processor", "LogitsProcessor", 512),
          ("", "EkkaToyForCausalLM", None)]
    r += [("model.norm", "RMSNorm", 256), ("lm_head", "Linear", 512), ("", "EkkaToyForCausalLM", None)]
    return _tree("vllm", t, src), _tree("hf", r, src)


def config(api: FakeAnthropic | None, tmp_path: Path, **kw) -> tuple[AgentConfig, list[float]]:
    sleeps: list[float] = []
    base = dict(api_key="test-key", base_url=api.url if api else None, kb_dir=tmp_path / "kb", shipped_kb=False,
                sleep=sleeps.append, timeout_s=5.0, target_version="0.32.0", reference_version="5.19.0")
    base.update(kw)
    return AgentConfig(**base), sleeps


def script_happy(api: FakeAnthropic, usage=(1000, 50)) -> None:
    """get_model_tree ×2 → get_class_definition → propose_mapping → finish."""
    api.reply(text("Looking at both trees."), tool_use("get_model_tree", {"framework": "target"}),
              tool_use("get_model_tree", {"framework": "reference"}), usage=usage)
    api.reply(tool_use("get_class_definition", {"framework": "target", "class_name": "WeirdLinear"}), usage=usage)
    api.reply(tool_use("propose_mapping", {"target_module": FANCY, "reference_modules": [DENSE], "relation": "1:1",
                                           "reason": "WeirdLinear loads dense_h_to_4h's weight: same projection"}),
              usage=usage)
    api.reply(tool_use("finish", {"summary": "mapped fancy_proj"}), usage=usage)


# ---------------------------------------------------------------------------------------------------------------
# the main path: agent maps, validator passes, knowledge base written, second run at $0

def test_agent_maps_component_then_knowledge_base_reuses_it_with_no_api_call(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    assert [u.module for u in mapping.unmapped if u.reason.startswith("no rule")] == [FANCY]
    rule_pairs = {p.component for p in mapping.pairs}
    cfg, sleeps = config(api, tmp_path)
    script_happy(api, usage=(1000, 50))

    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)

    assert out.status == "complete", out.message
    assert out.mapped == [FANCY] and out.unchecked == [] and out.rounds == 1
    pair = mapping.pair(FANCY)
    assert pair is not None and pair.relation == "1:1" and pair.reference.modules == [DENSE]
    assert pair.rule.startswith("agent")
    assert mapping.validate(t_tree.modules) == []
    assert {p.component for p in mapping.pairs} - {FANCY} == rule_pairs       # rule pairs untouched
    # usage, tokens, dollars
    assert out.usage.calls == 4 and out.usage.input_tokens == 4000 and out.usage.output_tokens == 200
    row, known = price_for(DEFAULT_MODEL)
    assert known and out.usage.dollars == pytest.approx((4000 * row["input"] + 200 * row["output"]) / 1e6)
    assert sleeps == []
    # what the client sent
    assert len(api.requests) == 4
    first = api.requests[0]["body"]
    assert first["model"] == DEFAULT_MODEL and first["max_tokens"] <= cfg.max_tokens_per_call
    assert {t["name"] for t in first["tools"]} >= {"get_model_tree", "get_class_definition", "get_tensor_sum",
                                                   "infer_tensor_match", "propose_mapping", "propose_aligner",
                                                   "finish"}
    assert "tool_choice" not in first                # current Sonnet models reject forced tool use
    assert FANCY in first["messages"][0]["content"]
    trees = api.tool_results(1)
    assert len(trees) == 2 and not any(r["is_error"] for r in trees)
    assert "WeirdLinear" in trees[0]["content"] and "dense_h_to_4h" in trees[1]["content"]
    source = api.tool_results(2)[0]
    assert not source["is_error"] and "class WeirdLinear(nn.Module):" in source["content"]
    assert "class FusedUp" not in source["content"]
    assert not api.tool_results(3)[0]["is_error"]
    # the assistant's own blocks are echoed back verbatim
    assert api.requests[1]["body"]["messages"][1]["content"][0] == {"type": "text", "text": "Looking at both trees."}
    # knowledge base written
    assert len(out.kb_written) == 1
    entry = json.loads(Path(out.kb_written[0]).read_text())
    assert entry["schema"] == "ekka.knowledge/1"
    assert entry["key"] == {"target_framework": "vllm", "target_version": "0.32", "reference_framework": "hf",
                            "reference_version": "5.19", "target_class": "EkkaToyForCausalLM",
                            "reference_class": "EkkaToyForCausalLM"}
    assert entry["mappings"][0]["target"] == FANCY and entry["mappings"][0]["reference"] == [DENSE]
    assert entry["mappings"][0]["target_class"] == "WeirdLinear"
    # the report field is plain JSON
    report_field = json.loads(json.dumps(out.to_json()))
    assert report_field["status"] == "complete" and report_field["usage"]["calls"] == 4
    assert report_field["knowledge_base"]["written"] == out.kb_written

    # second run: the knowledge base answers, the API is not called
    mapping2 = map_components(t_tree, r_tree)
    out2 = complete_mapping(mapping2, t_tree, r_tree, config=cfg)
    assert out2.status == "knowledge-base" and out2.from_kb == [FANCY]
    assert len(api.requests) == 4                                        # no new request
    assert out2.usage.calls == 0 and out2.usage.dollars == 0
    assert mapping2.pair(FANCY).reference.modules == [DENSE]
    assert mapping2.validate(t_tree.modules) == []


def test_nothing_to_do_when_rules_cover_everything(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    mapping.unmapped = [u for u in mapping.unmapped if u.module != FANCY]
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path)[0])
    assert out.status == "nothing-to-do" and out.ok and api.requests == []


# ---------------------------------------------------------------------------------------------------------------
# validator loop

def test_validator_failure_is_fed_back_and_corrected_in_round_two(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src, layers=2, fused=True)
    mapping = map_components(t_tree, r_tree)
    asked = sorted(u.module for u in mapping.unmapped if u.reason.startswith("no rule"))
    assert asked == sorted([f"model.layers.{i}.mlp.{m}" for i in (0, 1) for m in ("fancy_proj", "fused_up")])
    fused = {"target_module": "model.layers.{i}.mlp.fused_up",
             "reference_modules": ["model.layers.{i}.mlp.up_a", "model.layers.{i}.mlp.up_b"],
             "relation": "1:N", "reason": "fused up projection = up_a | up_b"}
    # round 1: wrong split sizes, and only layer 0's fancy_proj
    api.reply(tool_use("propose_mapping", {**fused, "split_sizes": [1024, 256]}),
              tool_use("propose_mapping", {"target_module": FANCY, "reference_modules": [DENSE], "relation": "1:1",
                                           "reason": "same projection"}),
              tool_use("finish", {}))
    # round 2: corrected
    api.reply(tool_use("propose_mapping", {**fused, "split_sizes": [1024, 512]}),
              tool_use("propose_mapping", {"target_module": "model.layers.{i}.mlp.fancy_proj",
                                           "reference_modules": ["model.layers.{i}.mlp.dense_h_to_4h"],
                                           "relation": "1:1", "reason": "same projection in every layer"}),
              tool_use("finish", {}))
    cfg, _ = config(api, tmp_path)

    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)

    assert out.status == "complete" and out.rounds == 2, out.validator_problems
    assert len(api.requests) == 2
    results = api.tool_results(1)
    early = results[0]                                  # propose_mapping's own answer warns at once
    assert not early["is_error"] and "validator will reject" in early["content"]
    finish = results[-1]
    assert finish["is_error"] is True and "Validator, round 1 of 3" in finish["content"]
    assert "split_sizes [1024, 256] sum to 1280" in finish["content"]
    assert "model.layers.1.mlp.fancy_proj (WeirdLinear): neither mapped nor explained" in finish["content"]
    assert mapping.validate(t_tree.modules) == []
    assert mapping.pair("model.layers.1.mlp.fused_up").reference.split_sizes == [1024, 512]
    assert mapping.pair("model.layers.1.mlp.fancy_proj").reference.modules == ["model.layers.1.mlp.dense_h_to_4h"]
    entry = json.loads(Path(out.kb_written[0]).read_text())
    assert sorted(m["target"] for m in entry["mappings"]) == ["model.layers.{i}.mlp.fancy_proj",
                                                             "model.layers.{i}.mlp.fused_up"]


def test_validator_rejects_unknown_modules_and_gives_up_after_max_rounds(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    bad = {"target_module": FANCY, "reference_modules": ["model.layers.0.mlp.dense_h_to_4x"], "relation": "1:1",
           "reason": "guess"}
    for _ in range(2):
        api.reply(tool_use("propose_mapping", bad), tool_use("finish", {}))
    cfg, _ = config(api, tmp_path, max_rounds=2)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "incomplete" and out.rounds == 2 and len(api.requests) == 2
    assert "not in the hf tree (close: model.layers.0.mlp.dense_h_to_4h" in api.tool_results(1)[-1]["content"]
    reason = next(u.reason for u in mapping.unmapped if u.module == FANCY)
    assert reason.startswith("unchecked: the agent could not map it") and "dense_h_to_4x" in reason
    assert mapping.pair(FANCY) is None and mapping.validate(t_tree.modules) == []
    assert out.kb_written == []


def test_explain_unmapped_is_accepted_and_recorded(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.reply(tool_use("explain_unmapped", {"target_module": FANCY, "reason": "no rule"}),           # rejected
              tool_use("explain_unmapped", {"target_module": FANCY,
                                            "reason": "a speculative-decoding draft head the reference lacks"}),
              tool_use("finish", {}))
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path)[0])
    assert out.status == "complete" and out.explained == [FANCY]
    assert api.requests and len(api.requests) == 1
    reason = next(u.reason for u in mapping.unmapped if u.module == FANCY)
    assert reason == "agent: a speculative-decoding draft head the reference lacks"
    assert mapping.validate(t_tree.modules) == []


def test_agent_cannot_touch_rule_made_pairs(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.reply(tool_use("propose_mapping", {"target_module": "model.norm", "reference_modules": ["lm_head"],
                                           "relation": "1:1", "reason": "x"}))
    script_happy(api)
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path)[0])
    err = api.tool_results(1)[0]
    assert err["is_error"] and "not one of the components you were asked about" in err["content"]
    assert mapping.pair("model.norm").reference.modules == ["model.norm"]
    assert out.status == "complete" and out.malformed_tool_calls == 0 and out.tool_errors == 1


# ---------------------------------------------------------------------------------------------------------------
# budget

def test_budget_exceeded_stops_and_leaves_component_unmapped_with_reason(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.reply(tool_use("get_model_tree", {"framework": "target"}), usage=(20_000, 500))   # $0.045 at $2/$10
    script_happy(api)
    cfg, _ = config(api, tmp_path, max_dollars=0.05)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "budget-exceeded" and out.budget_exceeded == "dollars"
    assert len(api.requests) == 1
    assert out.usage.dollars == pytest.approx(0.045) and out.usage.dollars <= cfg.max_dollars
    reason = next(u.reason for u in mapping.unmapped if u.module == FANCY)
    assert reason == "unchecked: agent budget exceeded (dollars)"
    assert out.unchecked == [{"module": FANCY, "reason": reason}]
    assert out.to_json()["budget"]["exceeded"] == "dollars"
    assert mapping.validate(t_tree.modules) == [] and mapping.pair(FANCY) is None


def test_budget_too_small_for_a_single_call_makes_no_request(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path, max_output_tokens=100)[0])
    assert out.status == "budget-exceeded" and out.budget_exceeded == "output tokens"
    assert api.requests == []


def test_budget_caps_max_tokens_and_prices_unknown_models_conservatively(tmp_path):
    cfg = AgentConfig(max_output_tokens=3000, max_tokens_per_call=8192)
    b = Budget(cfg)
    assert b.allow(1000) == 3000
    b.record({"input_tokens": 1000, "output_tokens": 2000})
    assert b.allow(1000) == 1000
    row, known = price_for("claude-sonnet-5-5-20260901")
    assert known and row["input"] == 2.0
    row, known = price_for("claude-someday-9")
    assert not known and row["output"] == max(r["output"] for r in AgentConfig().prices.values())


# ---------------------------------------------------------------------------------------------------------------
# API failures

def test_401_gives_a_clear_outcome_without_retrying(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.error(401, "authentication_error", "invalid x-api-key")
    cfg, sleeps = config(api, tmp_path)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "auth-failed" and not out.ok
    assert "rejected the API key (HTTP 401" in out.message and "ANTHROPIC_API_KEY" in out.message
    assert len(api.requests) == 1 and sleeps == []
    assert next(u.reason for u in mapping.unmapped if u.module == FANCY) == "unchecked: API key rejected (HTTP 401)"
    assert "left unchecked" in out.summary()


def test_429_with_retry_after_zero_is_retried_then_succeeds(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.error(429, "rate_limit_error", "slow down", headers={"retry-after": "0"})
    script_happy(api)
    cfg, sleeps = config(api, tmp_path)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "complete" and out.retries == 1
    assert sleeps == [0.0]
    assert len(api.requests) == 5 and out.usage.calls == 4
    assert any("HTTP 429" in e for e in out.events)


def test_429_asking_for_too_long_a_wait_stops(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.error(429, "rate_limit_error", "slow down", headers={"retry-after": "3600"})
    cfg, sleeps = config(api, tmp_path)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "rate-limited" and sleeps == [] and "3600 s" in out.message


def test_500_twice_then_success_backs_off(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.error(500, "api_error", "boom").error(529, "overloaded_error", "overloaded")
    script_happy(api)
    cfg, sleeps = config(api, tmp_path, backoff_s=1.0)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "complete" and out.retries == 2
    assert sleeps == [1.0, 2.0]
    assert mapping.pair(FANCY) is not None


def test_persistent_5xx_gives_up_after_bounded_retries(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    for _ in range(5):
        api.error(503, "api_error", "unavailable")
    cfg, sleeps = config(api, tmp_path, max_retries=2, backoff_s=0.5)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "api-error" and len(api.requests) == 3 and sleeps == [0.5, 1.0]
    assert "HTTP 503" in out.message
    assert next(u.reason for u in mapping.unmapped if u.module == FANCY) == "unchecked: API error (HTTP 503)"


def test_timeout_is_retried_then_reported(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.slow(1.0).slow(1.0)
    cfg, sleeps = config(api, tmp_path, timeout_s=0.2, max_retries=1)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "timeout" and len(sleeps) == 1
    assert next(u.reason for u in mapping.unmapped if u.module == FANCY) == "unchecked: API timed out"


def test_unreachable_api_is_reported_not_raised(tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                                   # nothing listens there now
    cfg, sleeps = config(None, tmp_path, base_url=f"http://127.0.0.1:{port}", max_retries=2)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "unreachable" and len(sleeps) == 2
    assert next(u.reason for u in mapping.unmapped if u.module == FANCY) == REASON_UNREACHABLE
    assert mapping.validate(t_tree.modules) == []


def test_malformed_tool_input_returns_tool_error_to_the_model(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.reply(tool_use("propose_mapping", {"target_module": 5, "relation": "1:1"}),
              tool_use("get_weather", {"city": "Paris"}))
    script_happy(api)
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path)[0])
    errs = api.tool_results(1)
    assert [r["is_error"] for r in errs] == [True, True]
    assert "missing required argument 'reference_modules'" in errs[0]["content"]
    assert "argument 'target_module' must be string" in errs[0]["content"]
    assert "unknown tool 'get_weather'" in errs[1]["content"]
    assert out.status == "complete" and out.malformed_tool_calls == 2 and out.tool_errors == 2


def test_too_many_malformed_calls_give_up(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.reply(tool_use("nope", {}), tool_use("get_model_tree", {}))
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path, max_malformed=2)[0])
    assert out.status == "gave-up" and len(api.requests) == 1 and out.malformed_tool_calls == 2
    assert "2 malformed tool calls" in next(u.reason for u in mapping.unmapped if u.module == FANCY)


def test_end_turn_without_finish_triggers_the_validator(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    api.reply(text("I think I am done."))                       # no tool use, no finish: validate anyway
    script_happy(api)
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path)[0])
    last = api.requests[1]["body"]["messages"][-1]["content"]
    assert last[0]["type"] == "text" and "neither mapped nor explained" in last[0]["text"]
    assert out.status == "complete" and out.rounds == 2


# ---------------------------------------------------------------------------------------------------------------
# no key / disabled / shipped knowledge base

def test_no_api_key_makes_no_request_and_records_the_reason(api, tmp_path, toy_src, monkeypatch):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    cfg, _ = config(api, tmp_path, api_key=None)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "no-api-key" and api.requests == []
    assert next(u.reason for u in mapping.unmapped if u.module == FANCY) == REASON_NO_KEY
    assert REASON_NO_KEY == "unchecked: no API key (set ANTHROPIC_API_KEY to let the agent map it)"
    assert mapping.validate(t_tree.modules) == []
    # the default configuration reads the environment
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    monkeypatch.setenv("EKKA_KNOWLEDGE_DIR", str(tmp_path / "kb-env"))
    assert AgentConfig.from_env().api_key is None
    mapping = map_components(t_tree, r_tree)
    out = complete_mapping(mapping, t_tree, r_tree, config=None)
    assert out.status == "knowledge-base" and api.requests == []       # the shipped toy entry knows this one
    for tree in (t_tree, r_tree):
        tree.modules[""].cls = "OtherToyForCausalLM"                    # a model no entry knows
    mapping = map_components(t_tree, r_tree)
    out = complete_mapping(mapping, t_tree, r_tree, config=None)
    assert out.status == "no-api-key" and api.requests == []
    assert not (tmp_path / "kb-env").exists()                           # nothing written without a result


def test_from_env_reads_settings_and_survives_bad_numbers(tmp_path):
    cfg = AgentConfig.from_env({"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "http://x", "EKKA_AGENT": "0",
                                "EKKA_AGENT_MODEL": "claude-opus-5-5", "EKKA_AGENT_MAX_DOLLARS": "lots",
                                "EKKA_AGENT_MAX_OUTPUT_TOKENS": "1234", "EKKA_KNOWLEDGE_DIR": str(tmp_path)})
    assert (cfg.api_key, cfg.base_url, cfg.enabled, cfg.model) == ("k", "http://x", False, "claude-opus-5-5")
    assert cfg.max_output_tokens == 1234 and cfg.max_dollars == AgentConfig().max_dollars
    assert cfg.notes and "EKKA_AGENT_MAX_DOLLARS" in cfg.notes[0] and cfg.resolved_kb_dir() == tmp_path


def test_shipped_knowledge_base_entry_is_used_offline_at_zero_cost(api, tmp_path, toy_src):
    assert (SHIPPED_DIR / "vllm-any__hf-any__EkkaToyForCausalLM__EkkaToyForCausalLM.json").exists()
    t_tree, r_tree = toy_trees(toy_src, layers=3)
    mapping = map_components(t_tree, r_tree)
    cfg, _ = config(api, tmp_path, api_key=None, shipped_kb=True)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "knowledge-base" and api.requests == []
    assert sorted(out.from_kb) == [f"model.layers.{i}.mlp.fancy_proj" for i in range(3)]
    assert mapping.pair("model.layers.2.mlp.fancy_proj").reference.modules == ["model.layers.2.mlp.dense_h_to_4h"]
    assert mapping.validate(t_tree.modules) == [] and out.usage.dollars == 0


def test_stale_knowledge_base_entry_is_not_used(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    kb = KnowledgeBase(tmp_path / "kb", shipped=False)
    from ekka_core.agent.session import kb_key
    cfg, _ = config(api, tmp_path, api_key=None)
    kb.store(kb_key(t_tree, r_tree, None, cfg),
             [Proposal(FANCY, ["model.layers.0.mlp.gone"], "1:1", reason="old layout", target_class="WeirdLinear")],
             [], [], model="m")
    mapping = map_components(t_tree, r_tree)
    out = complete_mapping(mapping, t_tree, r_tree, config=cfg)
    assert out.status == "no-api-key" and out.from_kb == []
    assert any("no longer validates" in n for n in out.notes)
    # with a key, the agent sees the stale entry in its first message
    mapping = map_components(t_tree, r_tree)
    script_happy(api)
    out = complete_mapping(mapping, t_tree, r_tree, config=config(api, tmp_path)[0])
    assert out.status == "complete"
    assert "no longer validate" in api.requests[0]["body"]["messages"][0]["content"]


def test_pattern_matching():
    assert match("model.layers.{i}.mlp.x", "model.layers.12.mlp.x") == "12"
    assert match("model.layers.{i}.mlp.x", "model.layers.a.mlp.x") is None
    assert match("a.{i}.b.{i}", "a.1.b.2") is None and match("a.{i}.b.{i}", "a.3.b.3") == "3"
    assert match("a.b", "a.b") == ""


# ---------------------------------------------------------------------------------------------------------------
# tensor tools on synthetic traces

def _write(directory: Path, framework: str, role: str, steps: list[Step], calls, src: Path,
           token_ids: list[list[int]] = ([1, 2, 3, 4, 5, 6],), prompt_lens: list[int] = (5,),
           trace_options: dict[str, str] | None = None) -> Trace:
    run = RunInfo(framework=framework, framework_version="0.32.0" if framework == "vllm" else "5.19.0", role=role,
                  model="toy", dtype="float32", prompts=["p"] * len(token_ids), token_ids=[list(t) for t in token_ids],
                  prompt_lens=list(prompt_lens), trace_options=dict(trace_options or {}))
    w = TraceWriter(directory, run)
    w.steps = steps
    for idx, (step, module, cls, outputs, inputs) in enumerate(calls):
        outs = [w.add_tensor(f"c{idx}.out{k}", t) for k, t in enumerate(outputs)]
        ins = [w.add_tensor(f"c{idx}.in{k}", t) for k, t in enumerate(inputs)]
        w.calls.append(ModuleCall(index=idx, step=step, module=module, cls=cls, qualname=f"toy_model.{cls}",
                                  class_file=str(src), class_line=5, forward_file=str(src), forward_line=12,
                                  inputs=ins, outputs=outs))
    w.close(complete=True)
    return Trace(directory)


@pytest.fixture
def traces(tmp_path, toy_src) -> Traces:
    g = torch.Generator().manual_seed(0)
    n = 6
    H, X, A, B, S = (torch.randn(n, w, generator=g) for w in (8, 8, 4, 6, 8))
    t_steps = [Step(0, "prefill", [0] * 5, list(range(5))), Step(1, "decode:1", [0], [5])]
    t_calls = []
    for step, rows in ((0, slice(0, 5)), (1, slice(5, 6))):
        t_calls += [(step, "model.layers.0.mlp.fancy_proj", "WeirdLinear", [X[rows]], [H[rows]]),
                    (step, "model.layers.0.mlp.fused", "FusedUp", [torch.cat([B, A], 1)[rows]], [H[rows]]),
                    (step, "model.layers.0.mlp.scaled", "ScaledThing", [2 * S[rows]], [H[rows]]),
                    (step, "", "EkkaToyForCausalLM", [X[rows]], [])]
    r_steps = [Step(0, "teacher-forced", [0] * n, list(range(n)))]
    r_calls = [(0, "model.layers.0.mlp.dense_h_to_4h", "Linear", [X[None]], [H[None]]),
               (0, "model.layers.0.mlp.a_proj", "Linear", [A[None]], [H[None]]),
               (0, "model.layers.0.mlp.b_proj", "Linear", [B[None]], [H[None]]),
               (0, "model.layers.0.mlp.scaled_ref", "Linear", [S[None]], [H[None]]),
               (0, "", "EkkaToyForCausalLM", [X[None]], [])]
    target = _write(tmp_path / "t", "vllm", "target", t_steps, t_calls, toy_src)
    reference = _write(tmp_path / "r", "hf", "reference", r_steps, r_calls, toy_src)
    return Traces(target, reference, reference)


def test_infer_tensor_match_finds_identity_concat_order_scale_and_slice(traces):
    t, r = traces.target, traces.reference
    ident = infer_match(t, r, "model.layers.0.mlp.fancy_proj", ["model.layers.0.mlp.dense_h_to_4h"])
    best = ident["candidates"][0]
    assert ident["verdict"].startswith("match: identity") and best["reference_port"] == "output"
    assert best["rows_compared"] == 6                       # prefill and decode rows both
    cat = infer_match(t, r, "model.layers.0.mlp.fused", ["model.layers.0.mlp.a_proj", "model.layers.0.mlp.b_proj"])
    best = cat["candidates"][0]
    assert best["kind"] == "concat" and best["rel_err"] < 1e-6
    assert best["reference_modules"] == ["model.layers.0.mlp.b_proj", "model.layers.0.mlp.a_proj"]
    assert best["propose"]["split_sizes"] == [6, 4] and best["propose"]["relation"] == "1:N"
    scaled = infer_match(t, r, "model.layers.0.mlp.scaled", ["model.layers.0.mlp.scaled_ref"], reference_port="output")
    best = scaled["candidates"][0]
    assert best["kind"] == "scaled" and best["scale"] == pytest.approx(0.5) and best["rel_err"] < 1e-6
    sl = infer_match(t, r, "model.layers.0.mlp.fused", ["model.layers.0.mlp.a_proj"], reference_port="output")
    best = sl["candidates"][0]
    assert best["kind"] == "slice-of-target" and best["target_slice"] == [6, 10] and best["rel_err"] < 1e-6


def test_agent_with_traces_uses_tensor_tools_validates_by_alignment_and_runs_aligners(api, tmp_path, traces):
    t_tree, r_tree = build_tree(traces.target), build_tree(traces.reference)
    mapping = map_components(t_tree, r_tree)
    asked = sorted(u.module for u in mapping.unmapped if u.reason.startswith("no rule"))
    assert asked == ["model.layers.0.mlp.fancy_proj", "model.layers.0.mlp.fused", "model.layers.0.mlp.scaled"]
    good = ("import numpy as np\nSELF_CHECKS = ['shape', 'row_sums', 'col_sums']\n\n"
            "def align(target, reference, meta):\n"
            "    t = target['out0']\n    r = reference['out0']\n"
            "    return t.reshape(-1, t.shape[-1]), r.reshape(-1, r.shape[-1])\n")
    wrong = good.replace("r.reshape(-1, r.shape[-1])", "r.reshape(-1, r.shape[-1])[:, :4]")
    fused = {"target_module": "model.layers.0.mlp.fused", "relation": "1:N", "reason": "concat"}
    api.reply(tool_use("get_tensor_sum", {"framework": "target", "module": FANCY}),
              tool_use("infer_tensor_match", {"target_module": "model.layers.0.mlp.fused",
                                              "reference_modules": ["model.layers.0.mlp.a_proj",
                                                                    "model.layers.0.mlp.b_proj"]}))
    api.reply(tool_use("propose_mapping", {**fused, "reference_modules": ["model.layers.0.mlp.a_proj",
                                                                          "model.layers.0.mlp.b_proj"],
                                           "split_sizes": [4, 6]}),                       # wrong order
              tool_use("propose_mapping", {"target_module": FANCY, "reference_modules": [DENSE], "relation": "1:1",
                                           "reason": "identity match"}),
              tool_use("propose_mapping", {"target_module": "model.layers.0.mlp.scaled",
                                           "reference_modules": ["model.layers.0.mlp.scaled_ref"], "relation": "1:1",
                                           "scale": 0.5, "reason": "target is 2x"}),
              tool_use("propose_aligner", {"target_module": FANCY, "source": wrong}),
              tool_use("propose_aligner", {"target_module": FANCY, "source": "import os\n" + good}),
              tool_use("propose_aligner", {"target_module": FANCY, "source": good}),
              tool_use("finish", {}))
    api.reply(tool_use("propose_mapping", {**fused, "reference_modules": ["model.layers.0.mlp.b_proj",
                                                                          "model.layers.0.mlp.a_proj"],
                                           "split_sizes": [6, 4]}),
              tool_use("finish", {}))
    cfg, _ = config(api, tmp_path)
    out = complete_mapping(mapping, t_tree, r_tree, traces=traces, config=cfg)

    assert out.status == "complete" and out.rounds == 2, (out.message, out.validator_problems)
    sums, match_ = api.tool_results(1)
    assert not sums["is_error"] and json.loads(sums["content"])["rows[first]"]["rows"] == 6
    assert json.loads(match_["content"])["candidates"][0]["split_sizes"] == [6, 4]
    r2 = api.tool_results(2)
    wrong_order, _, _, bad_shape, bad_import, ok, finish = r2
    assert "match the target far better" in wrong_order["content"]          # early warning
    assert bad_shape["is_error"] and "self-check failed" in bad_shape["content"]
    assert bad_import["is_error"] and "import of `os` is not allowed" in bad_import["content"]
    assert not ok["is_error"] and "aligner accepted" in ok["content"]
    assert finish["is_error"] and "far better" in finish["content"]
    assert mapping.pair("model.layers.0.mlp.fused").reference.modules == ["model.layers.0.mlp.b_proj",
                                                                          "model.layers.0.mlp.a_proj"]
    assert mapping.pair("model.layers.0.mlp.scaled").target.scale == 0.5
    assert out.aligners[FANCY]["checks"]["col_sums"] is True
    entry = json.loads(Path(out.kb_written[0]).read_text())
    assert entry["aligners"][0]["target"] == FANCY and "def align" in entry["aligners"][0]["source"]
    # the pairs really align the way the align stage aligns them
    from ekka_core.align import _calls_by_module, align_pair
    index = {id(tr): _calls_by_module(tr) for tr in (traces.target, traces.reference)}
    for comp in asked:
        ap = align_pair(mapping.pair(comp), traces, index, 0)
        assert torch.allclose(ap.target, ap.reference, atol=1e-5)      # the target's scale is applied


# ---------------------------------------------------------------------------------------------------------------
# agent-written aligners in the align stage

FUSED = "model.layers.0.mlp.fused"
FUSED_REFS = ["model.layers.0.mlp.b_proj", "model.layers.0.mlp.a_proj"]
CONCAT_ALIGNER = ("import numpy as np\nSELF_CHECKS = ['shape', 'row_sums', 'col_sums']\n\n"
                  "def align(target, reference, meta):\n"
                  "    ref = np.concatenate([reference['m0.out0'][0], reference['m1.out0'][0]], axis=-1)\n"
                  "    return target['out0'], ref\n")


@pytest.fixture
def batch_traces(tmp_path, toy_src) -> Traces:
    """Two sequences (4 and 3 tokens) in one engine batch: a prefill step holding both prompts, then a decode step
    holding both; the reference runs each sequence as its own [1, L, …] pass."""
    g = torch.Generator().manual_seed(1)
    lens = [4, 3]
    A = [torch.randn(n, 4, generator=g) for n in lens]
    B = [torch.randn(n, 6, generator=g) for n in lens]
    X = [torch.randn(n, 8, generator=g) for n in lens]
    t_steps = [Step(0, "prefill", [0, 0, 0, 1, 1], [0, 1, 2, 0, 1]), Step(1, "decode:1", [0, 1], [3, 2])]
    t_calls = []
    for step in t_steps:
        def rows(per_seq):
            return torch.stack([per_seq[s][p] for s, p in zip(step.seq, step.pos)])
        t_calls += [(step.index, FANCY, "WeirdLinear", [rows(X)], [rows(X)]),
                    (step.index, FUSED, "FusedUp", [torch.cat([rows(B), rows(A)], 1)], [rows(X)])]
    r_steps = [Step(s, "teacher-forced", [s] * n, list(range(n))) for s, n in enumerate(lens)]
    r_calls = []
    for s in range(2):
        r_calls += [(s, DENSE, "Linear", [X[s][None]], [X[s][None]]),
                    (s, "model.layers.0.mlp.a_proj", "Linear", [A[s][None]], [X[s][None]]),
                    (s, "model.layers.0.mlp.b_proj", "Linear", [B[s][None]], [X[s][None]])]
    ids = dict(token_ids=[[1, 2, 3, 4], [5, 6, 7]], prompt_lens=[3, 2])
    target = _write(tmp_path / "bt", "vllm", "target", t_steps, t_calls, toy_src, **ids)
    reference = _write(tmp_path / "br", "hf", "reference", r_steps, r_calls, toy_src, **ids)
    return Traces(target, reference, reference)


def _batch_mapping(aligner: str | None) -> Mapping:
    m = Mapping("vllm", "hf")
    m.pairs = [ComponentPair(FANCY, "1:1", "agent", Endpoint([FANCY]), Endpoint([DENSE])),
               ComponentPair(FUSED, "1:N", "agent", Endpoint([FUSED]), Endpoint(FUSED_REFS, split_sizes=[6, 4]),
                             aligner=aligner)]
    return m


def _count_sandbox_children(monkeypatch) -> list[int]:
    from ekka_core.align import sandbox
    spawned: list[int] = []
    real = sandbox._spawn

    def counting(*args, **kwargs):
        spawned.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sandbox, "_spawn", counting)
    return spawned


def test_align_applies_an_aligner_over_every_sequence_and_step_in_one_sandboxed_child(batch_traces, monkeypatch):
    builtin = {ap.pair.component: ap for ap in align(_batch_mapping(None), batch_traces)}
    spawned = _count_sandbox_children(monkeypatch)
    aligned = align(_batch_mapping(CONCAT_ALIGNER), batch_traces)
    custom = {ap.pair.component: ap for ap in aligned}
    assert aligned.failures == [] and set(custom) == {FANCY, FUSED}
    assert len(spawned) == 1                          # 2 sequences × 2 reference runs, one child
    a, b = custom[FUSED], builtin[FUSED]
    assert a.keys == b.keys == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]   # prefill + decode rows
    for x, y in ((a.target, b.target), (a.reference, b.reference), (a.reference_fp32, b.reference_fp32)):
        assert torch.equal(x, y)
    assert torch.allclose(a.target, a.reference)


def test_an_aligner_on_position_restricted_traces_compares_the_rows_both_sides_kept(tmp_path, toy_src):
    """--trace-positions "2-": the engine kept positions ≥ 2 plus the rows it sampled (sequence 1's prompt end at
    position 1); the teacher-forced reference kept positions ≥ 2 plus each sequence's last position. The custom
    aligner and the built-in path both compare exactly the rows both kept."""
    g = torch.Generator().manual_seed(2)
    A, B = [torch.randn(n, 4, generator=g) for n in (5, 4)], [torch.randn(n, 6, generator=g) for n in (5, 4)]
    t_steps = [Step(0, "prefill", [0, 1], [2, 1]), Step(1, "decode:1", [0, 1], [3, 2]),
               Step(2, "decode:2", [0, 1], [4, 3])]
    t_calls = [(st.index, FUSED, "FusedUp", [torch.stack([torch.cat([B[s][p], A[s][p]]) for s, p in
                                                         zip(st.seq, st.pos)])], []) for st in t_steps]
    r_steps = [Step(0, "teacher-forced", [0, 0, 0], [2, 3, 4]), Step(1, "teacher-forced", [1, 1], [2, 3])]
    r_calls = []
    for st in r_steps:
        s, rows = st.seq[0], st.pos
        r_calls += [(st.index, "model.layers.0.mlp.a_proj", "Linear", [A[s][rows][None]], []),
                    (st.index, "model.layers.0.mlp.b_proj", "Linear", [B[s][rows][None]], [])]
    ids = dict(token_ids=[[1, 2, 3, 4, 5], [6, 7, 8, 9]], prompt_lens=[3, 2], trace_options={"positions": "2-"})
    traces = Traces(_write(tmp_path / "t", "vllm", "target", t_steps, t_calls, toy_src, **ids),
                    *[_write(tmp_path / "r", "hf", "reference", r_steps, r_calls, toy_src, **ids)] * 2)
    mapping = _batch_mapping(CONCAT_ALIGNER)
    mapping.pairs = mapping.pairs[1:]
    custom = list(align(mapping, traces))
    mapping.pairs[0].aligner = None
    builtin = list(align(mapping, traces))
    want = [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3)]             # (1, 1) only the engine kept
    assert custom[0].keys == builtin[0].keys == want
    for a, b in ((custom[0].target, builtin[0].target), (custom[0].reference, builtin[0].reference)):
        assert torch.equal(a, b)
    assert torch.allclose(custom[0].target, custom[0].reference)


def test_a_failing_aligner_fails_only_its_pair(batch_traces):
    raising = "def align(target, reference, meta):\n    raise ValueError('no idea')\n"
    wrong_rows = CONCAT_ALIGNER.replace("return target['out0'], ref", "return target['out0'][:2], ref[:2]")
    for source, why in ((raising, "ValueError: no idea"), (wrong_rows, "meta['rows']")):
        aligned = align(_batch_mapping(source), batch_traces)
        assert [ap.pair.component for ap in aligned] == [FANCY]                  # the other pair is compared
        assert len(aligned.failures) == 1
        assert aligned.failures[0].startswith(f"{FUSED}: custom aligner failed: {FUSED}: sequence 0 against the "
                                              "reference") and why in aligned.failures[0]


def test_agent_aligner_is_set_on_the_pair_and_kept_in_mapping_json(api, tmp_path, batch_traces):
    t_tree, r_tree = build_tree(batch_traces.target), build_tree(batch_traces.reference)
    mapping = map_components(t_tree, r_tree)
    assert sorted(u.module for u in mapping.unmapped if u.reason.startswith("no rule")) == [FANCY, FUSED]
    api.reply(tool_use("propose_mapping", {"target_module": FUSED, "reference_modules": FUSED_REFS,
                                           "relation": "1:N", "split_sizes": [6, 4], "reason": "b | a"}),
              tool_use("propose_aligner", {"target_module": FUSED, "source": CONCAT_ALIGNER}),
              tool_use("propose_mapping", {"target_module": FANCY, "reference_modules": [DENSE], "relation": "1:1",
                                           "reason": "identity"}),
              tool_use("finish", {}))
    out = complete_mapping(mapping, t_tree, r_tree, traces=batch_traces, config=config(api, tmp_path)[0],
                           transcript_dir=tmp_path / "report")
    assert out.status == "complete", out.validator_problems
    results = [json.loads(line) for line in (tmp_path / "report" / out.transcript["jsonl"]).read_text().splitlines()]
    accepted = [r for r in results if r["type"] == "tool_result"][1]
    assert not accepted["is_error"] and "on sequence 0 (4 rows)" in accepted["content"]   # 3 prefill + 1 decode
    assert mapping.pair(FUSED).aligner == CONCAT_ALIGNER and mapping.pair(FANCY).aligner is None
    mapping.save(tmp_path / "mapping.json")
    assert Mapping.load(tmp_path / "mapping.json").pair(FUSED).aligner == CONCAT_ALIGNER
    stored = json.loads(Path(out.kb_written[0]).read_text())["aligners"][0]
    assert stored["reference"] == FUSED_REFS and stored["source"] == CONCAT_ALIGNER
    # the knowledge base brings the aligner back at $0, onto the pair
    mapping2 = map_components(t_tree, r_tree)
    out2 = complete_mapping(mapping2, t_tree, r_tree, traces=batch_traces, config=config(api, tmp_path)[0])
    assert out2.status == "knowledge-base" and len(api.requests) == 1
    assert mapping2.pair(FUSED).aligner == CONCAT_ALIGNER
    assert [ap.pair.component for ap in align(mapping2, batch_traces)] == [FANCY, FUSED]


def test_a_new_proposal_with_other_reference_modules_retires_the_aligner(api, tmp_path, batch_traces):
    t_tree, r_tree = build_tree(batch_traces.target), build_tree(batch_traces.reference)
    mapping = map_components(t_tree, r_tree)
    api.reply(tool_use("propose_mapping", {"target_module": FUSED, "reference_modules": FUSED_REFS,
                                           "relation": "1:N", "split_sizes": [6, 4], "reason": "b | a"}),
              tool_use("propose_aligner", {"target_module": FUSED, "source": CONCAT_ALIGNER}),
              tool_use("propose_aligner", {"target_module": FUSED, "source": CONCAT_ALIGNER,
                                           "reference_modules": FUSED_REFS[::-1]}),
              tool_use("propose_mapping", {"target_module": FUSED, "reference_modules": FUSED_REFS[::-1],
                                           "relation": "1:N", "split_sizes": [4, 6], "reason": "a | b?"}),
              tool_use("explain_unmapped", {"target_module": FANCY, "reason": "a draft head the reference lacks"}),
              tool_use("finish", {}))
    out = complete_mapping(mapping, t_tree, r_tree, traces=batch_traces,
                           config=config(api, tmp_path, max_rounds=1)[0], transcript_dir=tmp_path)
    records = [json.loads(line) for line in (tmp_path / out.transcript["jsonl"]).open()]
    _, _, other_refs, retire, _ = [r for r in records if r["type"] == "tool_result"]
    assert other_refs["is_error"] and "differ from your proposal" in other_refs["content"]
    assert "aligner of model.layers.0.mlp.fused was dropped" in retire["content"]
    # without its aligner the swapped order is checked against the tensors again, and rejected
    verdict = next(r for r in records if r["type"] == "validator")
    assert out.status == "incomplete" and any(p.startswith(FUSED) and "far better" in p for p in verdict["problems"])
    assert mapping.pair(FUSED) is None


# ---------------------------------------------------------------------------------------------------------------
# the transcript

def test_transcript_records_every_request_response_and_tool_call_without_the_key(api, tmp_path, toy_src):
    from ekka_core.agent.transcript import JSONL, MARKDOWN
    t_tree, r_tree = toy_trees(toy_src)
    report_dir = tmp_path / "report"
    script_happy(api, usage=(1000, 50))
    out = complete_mapping(map_components(t_tree, r_tree), t_tree, r_tree, config=config(api, tmp_path)[0],
                           transcript_dir=report_dir)
    assert out.status == "complete" and out.to_json()["transcript"] == {"jsonl": JSONL, "markdown": MARKDOWN}
    raw = (report_dir / JSONL).read_text()
    md = (report_dir / MARKDOWN).read_text()
    assert "test-key" not in raw and "test-key" not in md
    records = [json.loads(line) for line in raw.splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds[0] == "session" and kinds[-1] == "outcome"
    assert kinds.count("request") == kinds.count("response") == 4 and kinds.count("validator") == 1
    assert kinds.count("tool_call") == 5 and kinds.count("tool_result") == 4      # finish is answered by the validator
    session = records[0]
    assert session["system"].startswith("You are the component-mapping agent") and session["asked"] == [FANCY]
    assert {t["name"] for t in session["tools"]} >= {"propose_mapping", "propose_aligner", "finish"}
    first = next(r for r in records if r["type"] == "request")
    assert FANCY in first["new_user_text"][0] and first["max_tokens"] > 0
    assert all(r["usage"] == {"input_tokens": 1000, "output_tokens": 50, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 0} for r in records if r["type"] == "response")
    source = next(r for r in records if r["type"] == "tool_result" and r["name"] == "get_class_definition")
    assert "class WeirdLinear(nn.Module):" in source["content"]
    assert records[-1]["status"] == "complete" and records[-1]["usage"]["calls"] == 4
    assert "## Call 4" in md and "tool call `propose_mapping`" in md and "## Outcome" in md
    # a knowledge-base hit calls nothing and writes no transcript
    again = tmp_path / "report-kb"
    out2 = complete_mapping(map_components(t_tree, r_tree), t_tree, r_tree, config=config(api, tmp_path)[0],
                            transcript_dir=again)
    assert out2.status == "knowledge-base" and out2.transcript is None and not again.exists()


def test_transcript_of_a_rejected_key_and_of_retries(api, tmp_path, toy_src):
    from ekka_core.agent.transcript import JSONL
    t_tree, r_tree = toy_trees(toy_src)
    api.error(429, "rate_limit_error", "slow down", headers={"retry-after": "0"})
    api.error(401, "authentication_error", "invalid x-api-key test-key")
    out = complete_mapping(map_components(t_tree, r_tree), t_tree, r_tree, config=config(api, tmp_path)[0],
                           transcript_dir=tmp_path)
    assert out.status == "auth-failed"
    raw = (tmp_path / JSONL).read_text()
    assert "test-key" not in raw and "[redacted]" in raw            # even when an error message echoes it
    records = [json.loads(line) for line in raw.splitlines()]
    assert [r["type"] for r in records] == ["session", "request", "api_event", "outcome"]
    assert "HTTP 429" in records[2]["event"] and records[3]["status"] == "auth-failed"


def test_a_scale_that_gives_the_wrong_magnitude_is_rejected_also_from_the_knowledge_base(api, tmp_path, traces):
    """A constant folded into the other side depends on the model's size (Gemma's sqrt(hidden) normaliser): a
    knowledge-base entry made on another size must not pass."""
    from ekka_core.agent.session import kb_key
    t_tree, r_tree = build_tree(traces.target), build_tree(traces.reference)
    scaled, scaled_ref = "model.layers.0.mlp.scaled", "model.layers.0.mlp.scaled_ref"
    api.reply(tool_use("propose_mapping", {"target_module": scaled, "reference_modules": [scaled_ref],
                                           "relation": "1:1", "scale": 0.25, "reason": "target is 4x"}))
    cfg, _ = config(api, tmp_path, max_retries=0)
    complete_mapping(map_components(t_tree, r_tree), t_tree, r_tree, traces=traces, config=cfg)
    warning = api.tool_results(1)[0]["content"]
    assert "makes the target 0.5× the reference's magnitude; a scale of about 0.5 would match" in warning
    # the same mistake stored in the knowledge base is stale, not used
    KnowledgeBase(tmp_path / "kb", shipped=False).store(
        kb_key(t_tree, r_tree, traces, cfg),
        [Proposal(scaled, [scaled_ref], "1:1", scale=0.25, reason="target is 4x", target_class="ScaledThing")],
        [], [], model="m")
    out = complete_mapping(map_components(t_tree, r_tree), t_tree, r_tree, traces=traces,
                           config=config(api, tmp_path, api_key=None)[0])
    assert scaled not in out.from_kb
    assert any(f"{scaled}: a knowledge-base entry no longer validates (scale 0.25" in n for n in out.notes)


def test_a_remote_diagnosis_brings_the_transcript_back():
    from ekka_core.agent.transcript import JSONL, MARKDOWN
    from ekka_core.remote.agent import RESULT_FILES
    assert {JSONL, MARKDOWN} <= set(RESULT_FILES)
