"""Bug case ``compiled-default-rotary-native``: Rotary embedding wrong only in the implementation the compiled default
dispatches to (forward_native)."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS
from ekka_core.bugs.vllm_access import _vllm


def _rotary_native_wrong_style() -> None:
    """The class of vLLM #31626 / fix #31643 (on CPU, a CustomOp's forward_cpu and forward_native implementations
    disagreed, so output depended on which one the configuration dispatched to): a bug in the implementation only
    the compiled default runs. Under compilation custom_ops is ["none"], so RotaryEmbedding runs forward_native;
    eager runs custom_ops ["all"], i.e. forward_cpu (a C++ kernel, untouched). Injected: forward_native rotates in
    the other pairing style (NeoX half-split ↔ GPT-J interleaved)."""
    rotary = _vllm("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding")
    _vllm("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding", "forward_static")

    def forward_native(self: Any, positions: Any, query: Any, key: Any = None) -> Any:
        cos_sin_cache = self._match_cos_sin_cache_dtype(query)
        return self.forward_static(positions, query, key, self.head_size, self.rotary_dim, cos_sin_cache,
                                   not self.is_neox_style)

    rotary.forward_native = forward_native


BUG = Bug("compiled-default-rotary-native", "qwen2",
          "Rotary embedding wrong only in the implementation the compiled default dispatches to (forward_native)",
          "https://github.com/vllm-project/vllm/issues/31626 (fix https://github.com/vllm-project/vllm/pull/31643; "
          "analogue: forward_cpu and forward_native disagree, here the native one is wrong)",
          r"^model\.layers\.0\.self_attn\.rotary_emb$", _rotary_native_wrong_style,
          requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], max_new_tokens=8, expected_culprit=["custom_ops"])
