"""Bug case ``gemma-exact-gelu``: Gemma: exact GELU instead of tanh-approximate GELU."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _gemma_exact_gelu() -> None:
    """vLLM #3411 / fix #3653: Gemma's gated MLP used exact (erf) GELU instead of tanh-approximate GELU."""
    GeluAndMul = vllm_compat().activation_module().GeluAndMul
    gemma = vllm_compat().model_module("gemma")

    gemma._get_gemma_act_fn = lambda *a, **k: GeluAndMul(approximate="none")


# Exact vs tanh GELU differ by ~1e-3 relative on this tiny model's activations — below bf16 rounding (4e-3),
# far above fp32's: a subtle bug is diagnosed in fp32, where the reference's own noise is ~1e-6.
BUG = Bug("gemma-exact-gelu", "gemma", "Gemma: exact GELU instead of tanh-approximate GELU",
          "https://github.com/vllm-project/vllm/issues/3411 (fix https://github.com/vllm-project/vllm/pull/3653)",
          r"^model\.layers\.0\.mlp\.act_fn$", _gemma_exact_gelu, dtype="float32")
