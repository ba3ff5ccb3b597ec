"""The reference's logprobs at the positions an engine sampled (``reference-scores.json``, schema ``ekka.scores/2``):
what the symptom check compares an engine's own top-k logprobs with.

The HF reference is teacher-forced on the tokens the engine fed and generated, in the engine's low precision (X,
``low``) and in fp32 (Y, ``fp32``); at every sampled step it is read at the token ids the engine reported (its
top-k). MoE models add the positions whose expert routing is a tie within the reference's own rounding
(``routing_ties``) and, when there are any, the low-precision reference with every tied token routed to its next
expert (X′, ``low_rerouted``): the second noise floor. ``own_prompt_token_ids`` are the ids the reference's own
pipeline makes of each request, for the input pre-flight.

Built by :func:`ekka_core.capture.hf_runner.score` (a reference run of its own) or
:func:`ekka_core.capture.scores.scores_from_traces` (a traced run's reference traces), each step by
:func:`ekka_core.capture.scores.scored_request`; read by :func:`ekka_core.symptom.check_symptom`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ekka_core.contracts.jsonable import from_json, to_json

# Version 2 adds the second noise floor of MoE models (``low_rerouted``); older scores are recomputed, not reused.
SCORES_SCHEMA = "ekka.scores/2"
SCORES_FILE = "reference-scores.json"


@dataclass
class ScoredStep:
    """One sampled step: the reference's logprobs of the engine's top-k token ids there."""

    tokens: list[int]                # the engine's top-k token ids at this step, ascending
    logprobs: list[float]            # the reference's logprob of each of them
    argmax: int                      # the reference's own most likely token there


@dataclass
class ScoredRequest:
    request: int                     # index into the spec's request list (RequestOutcome.request)
    steps: list[ScoredStep] = field(default_factory=list)


@dataclass
class ScoredRun:
    """One reference run (one dtype, one routing) read at every request's sampled steps."""

    dtype: str
    requests: list[ScoredRequest] = field(default_factory=list)

    def steps(self) -> dict[int, list[ScoredStep]]:
        """request index → its scored steps."""
        return {r.request: r.steps for r in self.requests}


@dataclass
class ReferenceScores:
    low: ScoredRun                   # X: the reference in the engine's dtype
    fp32: ScoredRun                  # Y
    own_prompt_token_ids: list[list[int]] = field(default_factory=list)
    # request index → the token positions whose MoE expert routing is a tie within the reference's rounding
    routing_ties: dict[int, list[int]] = field(default_factory=dict)
    low_rerouted: ScoredRun | None = None      # X′: only when there are routing ties
    schema: str = SCORES_SCHEMA

    def save(self, directory: Path) -> Path:
        path = Path(directory) / SCORES_FILE
        path.write_text(json.dumps(to_json(self)))
        return path

    @staticmethod
    def load(directory: Path) -> "ReferenceScores | None":
        """The scores stored in ``directory``, or None when there are none or they are of an older schema (the
        caller scores the run again)."""
        path = Path(directory) / SCORES_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        if not isinstance(data, dict) or data.get("schema") != SCORES_SCHEMA:
            return None
        return from_json(ReferenceScores, data)
