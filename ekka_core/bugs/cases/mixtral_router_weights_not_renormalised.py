"""Bug case ``mixtral-router-weights-not-renormalised``: Mixtral's top-2 routing weights used without renormalising."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import force_kwargs


def _router_weights_not_renormalised() -> None:
    """HabanaAI/vllm-fork #73 ("Normalize router weights in MoE OP … to improve mixtral accuracy"): the fused MoE
    combined the top-k experts with their softmax probabilities as they are, not renormalised over the chosen k
    (the same class as SGLang #35160's renormalize=False path). Re-injected into vLLM's Mixtral."""
    force_kwargs("vllm.model_executor.models.mixtral", "FusedMoEFactory", renormalize=False)


BUG = Bug("mixtral-router-weights-not-renormalised", "sweep:mixtral",
          "Mixtral: top-2 routing weights not renormalised over the chosen experts",
          "https://github.com/HabanaAI/vllm-fork/pull/73 (pattern; injected into vLLM's Mixtral)",
          r"^model\.layers\.0\.block_sparse_moe(\.experts)?$", _router_weights_not_renormalised)
