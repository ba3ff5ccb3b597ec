"""Bug case ``mlp-fp16-overflow-prescaled-down-proj``: the MLP's down projection applies a scale to its fp16 input
before the matmul instead of after it, so the rows with the largest activations overflow to Inf."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat

# The scale: exact arithmetic makes (x·S) @ W / S equal x @ W; in fp16 x·S is Inf wherever |x| > 65504 / S ≈ 11,
# which only a few rows of layer 0's down-projection inputs exceed (request 0, tokens 1, 4 and 25).
SCALE = 5955.0


def _down_proj_prescaled() -> None:
    """The class of vLLM #33461 / #33560 (fix https://github.com/vllm-project/vllm/pull/33972: with dtype=float16 a
    GEMM's input overflowed fp16 and the output was NaN/Inf; the fix scales the input down before the GEMM) and of
    HF transformers #27179 (Llama in fp16: Inf first at an MLP's down projection). Emulated in Granite's MLP: the
    down projection multiplies its fp16 input by a static scale before the matmul and divides the output by it after
    — a no-op in exact arithmetic, but the rows whose activations exceed 65504 / scale become Inf, then NaN in every
    later module that mixes them. The fp32 reference, which has no such scale, stays finite."""
    granite = vllm_compat().model_module("granite")
    original = granite.GraniteMLP.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        down = self.down_proj
        forward = down.forward

        def prescaled(x: Any) -> Any:
            out, bias = forward(x * SCALE)
            return out / SCALE, bias

        down.forward = prescaled

    granite.GraniteMLP.__init__ = __init__


BUG = Bug("mlp-fp16-overflow-prescaled-down-proj", "granite",
          "MLP down projection scales its fp16 input before the matmul instead of after: a few rows overflow to Inf",
          "https://github.com/vllm-project/vllm/pull/33972 (fixes https://github.com/vllm-project/vllm/issues/33461, "
          "https://github.com/vllm-project/vllm/issues/33560: fp16 GEMM overflow → NaN/Inf; see also "
          "https://github.com/huggingface/transformers/issues/27179) — emulated in Granite's MLP",
          r"^model\.layers\.0\.mlp\.down_proj$", _down_proj_prescaled, dtype="float16",
          expected_kind="non-finite")
