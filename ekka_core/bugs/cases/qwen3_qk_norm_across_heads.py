"""Bug case ``qwen3-qk-norm-across-heads``: QK-norm computed across all heads instead of per head."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _qk_norm_across_heads() -> None:
    """vLLM #16300 / fix #16311 (Llama 4), injected into Qwen3's per-head q_norm: the RMS is taken over all heads
    of a token instead of over each head."""
    import torch

    qwen3 = vllm_compat().model_module("qwen3")

    original = qwen3.Qwen3Attention.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        norm = self.q_norm

        def forward(x: torch.Tensor, residual: Any = None) -> torch.Tensor:
            flat = x.float().reshape(*x.shape[:-2], -1)
            rms = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            return ((flat * rms).reshape(x.shape) * norm.weight.float()).to(x.dtype)

        norm.forward = forward

    qwen3.Qwen3Attention.__init__ = __init__


BUG = Bug("qwen3-qk-norm-across-heads", "qwen3", "QK-norm computed across all heads instead of per head",
          "https://github.com/vllm-project/vllm/issues/16300 (fix https://github.com/vllm-project/vllm/pull/16311)",
          r"^model\.layers\.0\.self_attn\.q_norm$", _qk_norm_across_heads)
