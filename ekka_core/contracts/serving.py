"""The served configuration and what an engine produced when it ran one: the artefacts of the symptom check and of
configuration triage (issue: diagnose the configuration users actually serve).

* :class:`ConfigChange` — one engine argument a traced run sets differently from the served configuration, and why.
* :class:`EngineOutputs` (``outputs.json``, schema ``ekka.outputs/1``) — one engine run, traced or not: the
  configuration it resolved (what actually ran: compile mode, custom ops, prefix caching, chunk budget, batch
  size), and per request the token ids the engine fed the model, what it generated, the top-k logprobs it sampled
  from, and how many prompt tokens came from the prefix cache.
* :class:`SymptomCheck` — those outputs against the reference teacher-forced on the same tokens, as an error ratio
  at the logits level (the same idea as the per-module ratio): is there a bug at all, in this configuration?
* :class:`Trial` / :class:`Triage` — delta debugging over the :data:`FACTORS` in which the served and the traced
  configuration differ: which of them make the difference.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ekka_core.contracts.errors import BadInput

OUTPUTS_SCHEMA = "ekka.outputs/1"
OUTPUTS_FILE = "outputs.json"

# The served-configuration features a traced baseline turns off, each one engine-argument group. Triage applies
# subsets of them to the baseline. Names are part of report.json.
FACTORS = {
    "compilation": "torch.compile (compilation mode, backend, passes)",
    "custom_ops": "which implementation of each custom op runs (custom_ops)",
    "prefix_caching": "prefix caching",
    "chunked_prefill": "chunked prefill (max_num_batched_tokens)",
    "batching": "batch composition (several requests in one step: max_num_seqs)",
}
# Hooks see into every factor but compilation: a compiled graph runs without calling module hooks.
TRACEABLE_FACTORS = ("custom_ops", "prefix_caching", "chunked_prefill", "batching")


@dataclass
class ConfigChange:
    arg: str
    served: Any
    traced: Any
    why: str

    def words(self) -> str:
        served = "unset" if self.served is None else repr(self.served)
        return f"{self.arg}={self.traced!r} (served: {served}) — {self.why}"


@dataclass
class RequestOutcome:
    request: int                     # index into the spec's request list
    prompt_token_ids: list[int]      # what the engine fed the model for the prompt (its request path's output)
    generated: list[int]
    # Per generated position: the engine's top-k {token id: logprob} at the step that sampled it.
    logprobs: list[dict[int, float]] = field(default_factory=list)
    num_cached_tokens: int = 0       # prompt tokens served from the prefix cache (not computed for this request)
    wave: int = 0

    @property
    def fed_token_ids(self) -> list[int]:
        """What the model was fed: the prompt and every generated token but the last (which is only sampled)."""
        return self.prompt_token_ids + self.generated[:-1]

    @staticmethod
    def from_json(d: dict[str, Any]) -> "RequestOutcome":
        d = dict(d)
        d["logprobs"] = [{int(k): float(v) for k, v in step.items()} for step in d.get("logprobs", [])]
        return RequestOutcome(**d)


@dataclass
class EngineOutputs:
    framework: str
    framework_version: str
    label: str                       # "served", "traced", "trial 3", …
    args: dict[str, Any]             # engine arguments as passed
    resolved: dict[str, Any]         # what the engine resolved them to (see FACTORS), read from its own config
    dtype: str                       # the dtype the engine really ran in
    requests: list[RequestOutcome] = field(default_factory=list)
    traced: bool = False
    seconds: float = 0.0
    start_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    # The label of the run whose sampled tokens this run was made to sample (a traced run fed the served run's
    # tokens: ekka_core.capture.vllm_forcing); "" when the engine sampled its own.
    forced_tokens_from: str = ""
    schema: str = OUTPUTS_SCHEMA

    def save(self, directory: Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / OUTPUTS_FILE
        path.write_text(json.dumps(asdict(self), default=str))
        return path

    @staticmethod
    def load(directory: Path) -> "EngineOutputs":
        path = Path(directory) / OUTPUTS_FILE
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise BadInput(f"{directory} holds no engine outputs ({OUTPUTS_FILE})",
                           fix="run the diagnosis again (--fresh)") from None
        if d.get("schema") != OUTPUTS_SCHEMA:
            raise BadInput(f"{path} has schema {d.get('schema')!r}, expected {OUTPUTS_SCHEMA!r}",
                           fix="run the diagnosis again with this version of Ekka (--fresh)")
        d["requests"] = [RequestOutcome.from_json(r) for r in d["requests"]]
        return EngineOutputs(**d)


@dataclass
class PositionRatio:
    request: int
    position: int                    # token position whose logits were compared (the one that sampled)
    ratio: float
    token_matches_reference: bool    # the engine's sampled token is the reference's argmax there (fp32)
    # An MoE token whose expert choice is a tie within the reference's own rounding: a correct engine may route it
    # elsewhere, so it is shown but left out of the run's ratio.
    routing_tie: bool = False


@dataclass
class SymptomCheck:
    label: str                       # which run ("served", "traced", "trial 2")
    ratio: float                     # logits-level error ratio over every compared position
    diverges: bool
    threshold: float
    positions: list[PositionRatio] = field(default_factory=list)
    first: PositionRatio | None = None      # the first position (per request order) that diverges
    cached_tokens: int = 0
    # ‖lp_T − lp_X‖ / ‖lp_X − lp_Y‖: how far the engine's logprobs are from the reference's in the same dtype, in
    # units of that reference's own rounding error (an engine can be close to fp32 and far from the reference).
    same_dtype: float | None = None
    note: str = ""
    # MoE: how many tied tokens the second noise floor (the reference routed the other way there) rerouted; 0: none.
    rerouted_tokens: int = 0
    non_finite: int = 0              # sampled positions whose logprobs are NaN/Inf where the reference's are finite

    def words(self) -> str:
        if self.non_finite:
            return (f"{self.label}: diverges from the reference at the logits level — NaN/Inf logprobs at "
                    f"{self.non_finite} sampled position(s)")
        state = "diverges from" if self.diverges else "matches"
        where = (f"; first at request {self.first.request}, token {self.first.position}" if self.first else "")
        return f"{self.label}: {state} the reference at the logits level (ratio {self.ratio:.2f}){where}"


@dataclass
class Trial:
    factors: list[str]               # the served features applied on top of the traced baseline
    args: dict[str, Any]
    ratio: float | None
    diverges: bool | None            # None: the configuration could not run (error says why)
    seconds: float = 0.0
    error: str | None = None
    # A compiled configuration's graph: "loaded" from vLLM's compile cache or "compiled" in the trial ("": eager)
    compiled_graph: str = ""


@dataclass
class FactorDifference:
    """One served feature's value in the served run and in the traced baseline, as each engine resolved it."""

    served: Any
    baseline: Any


@dataclass
class Triage:
    served: SymptomCheck
    baseline: SymptomCheck
    # the factors that differ (and were not ruled out)
    differing: dict[str, FactorDifference] = field(default_factory=dict)
    ruled_out: dict[str, str] = field(default_factory=dict)     # factor → why it cannot matter here
    # ruled-out factors every trial keeps at their served values (the same computation for these requests)
    kept_as_served: list[str] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    culprit: list[str] = field(default_factory=list)            # minimal set of factors (delta debugging)
    direction: str = "served-diverges"                          # or "traced-diverges", "both", "neither"
    words: str = ""
    traced_under: list[str] = field(default_factory=list)       # factors the final trace ran with
    untraceable: list[str] = field(default_factory=list)        # culprit factors hooks cannot see into
    exhausted: bool = False      # the trial budget ran out before the culprit was narrowed to a minimal set
