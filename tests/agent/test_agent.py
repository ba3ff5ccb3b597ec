"""The mapping agent (ekka_core.agent) against a local FAKE of the Anthropic Messages API (tests/support/fake_anthropic.py):
the main path, the validator loop, the budget, API failures, no key and the knowledge base.

Trees are built by hand (tests/support/agent_toy.py): a toy model whose target MLP holds ``fancy_proj`` where the
reference holds ``dense_h_to_4h`` — a path no rule can connect. No network, no real API, no sleeping: every
back-off goes through an injected ``sleep``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from agent_toy import DENSE, FANCY, config, script_happy, toy_trees
from ekka_core.agent import (DEFAULT_MODEL, REASON_NO_KEY, REASON_UNREACHABLE, AgentConfig, complete_mapping,
                             price_for)
from ekka_core.agent.budget import Budget
from ekka_core.agent.kb import SHIPPED_DIR, KnowledgeBase
from ekka_core.agent.proposals import Proposal, match
from ekka_core.mapping import map_components
from fake_anthropic import text, tool_use


# ---------------------------------------------------------------------------------------------------------------
# the main path: agent maps, validator passes, knowledge base written, second run at $0

def test_agent_maps_component_then_knowledge_base_reuses_it_with_no_api_call(api, tmp_path, toy_src):
    t_tree, r_tree = toy_trees(toy_src)
    mapping = map_components(t_tree, r_tree)
    assert [u.module for u in mapping.unmapped if u.open] == [FANCY]
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
    asked = sorted(u.module for u in mapping.unmapped if u.open)
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
    (u,) = [u for u in mapping.unmapped if u.module == FANCY]
    assert u.reason == "agent: a speculative-decoding draft head the reference lacks"
    assert u.status == "agent-explained" and not u.open
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
    assert next(u.status for u in mapping.unmapped if u.module == FANCY) == "unchecked"
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


