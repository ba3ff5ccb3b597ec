"""The mapping agent with traces (synthetic, written with TraceWriter: tests/support/agent_toy.py): the tensor tools,
validation by alignment, agent-written aligners in the align stage, and the transcript.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent_toy import (CONCAT_ALIGNER, DENSE, FANCY, FUSED, FUSED_REFS, batch_mapping, config, count_sandbox_children,
                       script_happy, toy_trees, write_trace)
from ekka_core.agent import complete_mapping
from ekka_core.agent.kb import KnowledgeBase
from ekka_core.agent.proposals import Proposal
from ekka_core.agent.tensors import infer_match
from ekka_core.align import Traces, align
from ekka_core.capture.trace import Step
from ekka_core.mapping import Mapping, map_components
from ekka_core.tree import build_tree
from fake_anthropic import tool_use


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
    from ekka_core.align import align_pair
    for comp in asked:
        ap = align_pair(mapping.pair(comp), traces, 0)
        assert torch.allclose(ap.target, ap.reference, atol=1e-5)      # the target's scale is applied


def test_align_applies_an_aligner_over_every_sequence_and_step_in_one_sandboxed_child(batch_traces, monkeypatch):
    builtin = {ap.pair.component: ap for ap in align(batch_mapping(None), batch_traces)}
    spawned = count_sandbox_children(monkeypatch)
    aligned = align(batch_mapping(CONCAT_ALIGNER), batch_traces)
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
    traces = Traces(write_trace(tmp_path / "t", "vllm", "target", t_steps, t_calls, toy_src, **ids),
                    *[write_trace(tmp_path / "r", "hf", "reference", r_steps, r_calls, toy_src, **ids)] * 2)
    mapping = batch_mapping(CONCAT_ALIGNER)
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
        aligned = align(batch_mapping(source), batch_traces)
        assert [ap.pair.component for ap in aligned] == [FANCY]                  # the other pair is compared
        (failure,) = aligned.failures
        assert failure.component == FUSED
        assert failure.reason.startswith(f"{FUSED}: custom aligner failed: {FUSED}: sequence 0 against the "
                                         "reference") and why in failure.reason
        assert failure.unchecked().module == FUSED


def test_agent_aligner_is_set_on_the_pair_and_kept_in_mapping_json(api, tmp_path, batch_traces):
    t_tree, r_tree = build_tree(batch_traces.target), build_tree(batch_traces.reference)
    mapping = map_components(t_tree, r_tree)
    assert sorted(u.module for u in mapping.unmapped if u.status == "no-rule") == [FANCY, FUSED]
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
    from ekka_core.remote.host import RESULT_FILES
    assert {JSONL, MARKDOWN} <= set(RESULT_FILES)
