"""Bug case ``qwen2-moe-shared-expert-gate-dropped``: Qwen2-MoE's shared expert added without its sigmoid gate."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _shared_expert_gate_dropped() -> None:
    """lmdeploy #3491 ("Fix Qwen2MoE shared expert gate"; vLLM reworked the same gate in #31339): the shared
    expert's output reached the residual stream without ``sigmoid(shared_expert_gate(x))``. Re-injected into vLLM's
    Qwen2-MoE, whose shared expert applies that gate inside its own forward — and which vLLM's fused-MoE runner
    calls from inside ``experts``, away from the module tree's order."""
    qwen2_moe = vllm_compat().model_module("qwen2_moe")
    original = qwen2_moe.Qwen2MoeMLP.forward

    def forward(self: Any, x: Any) -> Any:
        gate, self.expert_gate = self.expert_gate, None
        try:
            return original(self, x)
        finally:
            self.expert_gate = gate

    qwen2_moe.Qwen2MoeMLP.forward = forward


BUG = Bug("qwen2-moe-shared-expert-gate-dropped", "qwen2_moe",
          "Qwen2-MoE: the shared expert's output added without its sigmoid gate",
          "https://github.com/InternLM/lmdeploy/pull/3491 (pattern; injected into vLLM's Qwen2-MoE)",
          r"^model\.layers\.0\.mlp(\.experts\._shared_experts\._layer)?$", _shared_expert_gate_dropped)
