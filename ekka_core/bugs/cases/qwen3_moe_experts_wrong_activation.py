"""Bug case ``qwen3-moe-experts-wrong-activation``: Fused MoE experts built with the wrong activation (exact GELU)."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import force_kwargs


def _moe_wrong_activation() -> None:
    """vLLM fix #41574 (Gemma 4 MoE: the fused experts got the wrong GELU); the same pattern — the fused-MoE
    experts built with a different activation than the model's — injected into Qwen3-MoE (exact GELU for SiLU)."""
    force_kwargs("vllm.model_executor.models.qwen3_moe", "FusedMoEFactory", activation="gelu")


BUG = Bug("qwen3-moe-experts-wrong-activation", "qwen3_moe",
          "Fused MoE experts built with the wrong activation (exact GELU)",
          "https://github.com/vllm-project/vllm/pull/41574 (pattern; injected into Qwen3-MoE)",
          r"^model\.layers\.0\.mlp\.experts$", _moe_wrong_activation)
