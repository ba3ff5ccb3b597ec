"""The reference scores contract (``reference-scores.json``, ``ekka.scores/2``): files written before it was typed
still load, a round trip keeps every field, and scores of an older schema are not reused."""

from __future__ import annotations

import json

from ekka_core.contracts.scores import SCORES_FILE, ReferenceScores, ScoredRequest, ScoredRun, ScoredStep

STEP = {"tokens": [3, 7], "logprobs": [-0.25, -1.5], "argmax": 3}
# As run_process wrote it before the contract: routing ties keyed by the request index as a JSON string,
# ``low_rerouted`` only when there are ties.
STORED = {"schema": "ekka.scores/2",
          "low": {"dtype": "bfloat16", "requests": [{"request": 0, "steps": [STEP]}]},
          "fp32": {"dtype": "float32", "requests": [{"request": 0, "steps": [STEP, STEP]}]},
          "own_prompt_token_ids": [[1, 2, 3]],
          "routing_ties": {"0": [1, 2]},
          "low_rerouted": {"dtype": "bfloat16", "requests": [{"request": 0, "steps": [STEP]}]}}


def test_scores_stored_before_the_contract_load_typed(tmp_path):
    (tmp_path / SCORES_FILE).write_text(json.dumps(STORED))
    scores = ReferenceScores.load(tmp_path)
    assert scores.low == ScoredRun("bfloat16", [ScoredRequest(0, [ScoredStep([3, 7], [-0.25, -1.5], 3)])])
    assert scores.fp32.steps()[0][1].argmax == 3 and scores.own_prompt_token_ids == [[1, 2, 3]]
    assert scores.routing_ties == {0: [1, 2]} and scores.low_rerouted.dtype == "bfloat16"
    # Saved again, the file holds the same JSON.
    scores.save(tmp_path)
    assert json.loads((tmp_path / SCORES_FILE).read_text()) == STORED


def test_scores_without_ties_have_no_second_noise_floor(tmp_path):
    stored = {k: v for k, v in STORED.items() if k != "low_rerouted"} | {"routing_ties": {}}
    (tmp_path / SCORES_FILE).write_text(json.dumps(stored))
    scores = ReferenceScores.load(tmp_path)
    assert scores.low_rerouted is None and scores.routing_ties == {}


def test_scores_of_an_older_schema_or_none_at_all_are_not_reused(tmp_path):
    assert ReferenceScores.load(tmp_path) is None
    (tmp_path / SCORES_FILE).write_text(json.dumps(STORED | {"schema": "ekka.scores/1"}))
    assert ReferenceScores.load(tmp_path) is None
    (tmp_path / SCORES_FILE).write_text(json.dumps({k: v for k, v in STORED.items() if k != "schema"}))
    assert ReferenceScores.load(tmp_path) is None
