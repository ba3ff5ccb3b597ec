"""Bug case ``rmsnorm-weight-in-fp32``: RMSNorm multiplies by the weight in fp32 and rounds once (reference rounds x to
bf16 first)."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS
from ekka_core.bugs.vllm_access import _vllm


def _rmsnorm_weight_in_fp32() -> None:
    """vLLM #42325 / fix #42379 (regression v0.20.0–v0.20.2 in csrc/layernorm_kernels.cu): RMSNorm multiplied by
    the weight in fp32 and rounded once, ``(x * rsqrt * float(w)).to(bf16)``, where the spec (and HF) rounds the
    normalised x to the weight dtype first, ``(x * rsqrt).to(bf16) * w``. On CPU every RMSNorm runs
    ``RMSNorm.forward_native`` in both modes (RMSNorm has no forward_cpu; CustomOp.forward_cpu delegates to it, and
    the IR op ``rms_norm`` has no CPU kernel), so the emulation goes there — both the plain and the fused-add form."""
    import torch

    rms_norm = _vllm("vllm.model_executor.layers.layernorm", "RMSNorm")
    original = rms_norm.forward_native

    def forward_native(self: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        if getattr(self, "variance_size_override", None) is not None or not getattr(self, "has_weight", True):
            return original(self, x, residual)
        dtype = x.dtype
        h = x.to(torch.float32)
        if residual is not None:
            h = h + residual.to(torch.float32)
            residual = h.to(dtype)
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        out = (h * self.weight.data.to(torch.float32)).to(dtype)
        return out if residual is None else (out, residual)

    rms_norm.forward_native = forward_native


BUG = Bug("rmsnorm-weight-in-fp32", "llama",
          "RMSNorm multiplies by the weight in fp32 and rounds once (reference rounds x to bf16 first)",
          "https://github.com/vllm-project/vllm/issues/42325 (fix https://github.com/vllm-project/vllm/pull/42379; "
          "regression v0.20.0–v0.20.2 in the CUDA kernel, emulated in RMSNorm.forward_native)",
          r"^model\.layers\.0\.input_layernorm$", _rmsnorm_weight_in_fp32,
          requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], engine_args={"enforce_eager": True}, max_new_tokens=8,
          expected_rank=3, expected_words=r"closer to fp32")
