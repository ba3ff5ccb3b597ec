"""Bug case ``llama-attention-bias-dropped``: Llama: attention_bias ignored, q/k/v biases silently dropped."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _attention_bias_dropped() -> None:
    """vLLM #3767: LlamaAttention ignored `attention_bias`; the loader silently skipped the q/k/v bias tensors."""
    llama = vllm_compat().model_module("llama")

    original = llama.LlamaAttention.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["bias"] = False
        kwargs["bias_o_proj"] = False
        original(self, *args, **kwargs)

    llama.LlamaAttention.__init__ = __init__
    original_load = llama.LlamaModel.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        return original_load(self, ((n, w) for n, w in weights if not n.endswith("_proj.bias")))

    llama.LlamaModel.load_weights = load_weights


BUG = Bug("llama-attention-bias-dropped", "llama", "Llama: attention_bias ignored, q/k/v biases silently dropped",
          "https://github.com/vllm-project/vllm/pull/3767",
          r"^model\.layers\.0\.self_attn\.qkv_proj$", _attention_bias_dropped,
          zoo_overrides={"attention_bias": True})
