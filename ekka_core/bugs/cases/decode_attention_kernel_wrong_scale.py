"""Bug case ``decode-attention-kernel-wrong-scale``: Decode-only attention kernel path wrong (emulated: softmax scale
×1.5 on decode steps)."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _decode_kernel_wrong_scale() -> None:
    """Emulates the class of SGLang #13044 (a FlashInfer attention kernel wrong on one path, right on the other):
    the decode-only attention path uses a wrong softmax scale. Prefill is untouched, so the divergence must start
    at the first decode step."""
    impl = vllm_compat().cpu_attention_impl_class()
    original = impl.forward

    def forward(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, attn_metadata: Any,
                *args: Any, **kwargs: Any) -> Any:
        if attn_metadata is None or attn_metadata.max_query_len != 1:
            return original(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        scale = self.scale
        self.scale = scale * 1.5
        try:
            return original(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        finally:
            self.scale = scale

    impl.forward = forward


BUG = Bug("decode-attention-kernel-wrong-scale", "qwen2",
          "Decode-only attention kernel path wrong (emulated: softmax scale ×1.5 on decode steps)",
          "https://github.com/sgl-project/sglang/issues/13044 (pattern: attention kernel wrong on one path)",
          r"^model\.layers\.0\.self_attn\.attn$", _decode_kernel_wrong_scale)
