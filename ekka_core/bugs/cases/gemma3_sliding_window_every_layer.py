"""Bug case ``gemma3-sliding-window-every-layer``: Gemma 3: interleaved sliding window not detected, global layers use
the local window."""

from __future__ import annotations

import functools
from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS
from ekka_core.bugs.vllm_access import vllm_compat


def _gemma3_sliding_window_everywhere() -> None:
    """vLLM #17689 / fix #21927: interleaved sliding window not detected, so the global layers also got the
    model-level window (Attention falls back to the model's sliding_window when its own is None)."""
    get_current_vllm_config = vllm_compat().current_vllm_config
    attention_mod = vllm_compat().attention_module()

    original = attention_mod.Attention.__init__

    @functools.wraps(original)
    def __init__(self, *args: Any, per_layer_sliding_window: int | None = None, **kwargs: Any) -> None:
        hf = get_current_vllm_config().model_config.hf_text_config
        if per_layer_sliding_window is None and getattr(hf, "sliding_window", None):
            per_layer_sliding_window = hf.sliding_window
        original(self, *args, per_layer_sliding_window=per_layer_sliding_window, **kwargs)

    attention_mod.Attention.__init__ = __init__


BUG = Bug("gemma3-sliding-window-every-layer", "gemma3_text",
          "Gemma 3: interleaved sliding window not detected, global layers use the local window",
          "https://github.com/vllm-project/vllm/issues/17689 (fix https://github.com/vllm-project/vllm/pull/21927)",
          r"^model\.layers\.3\.self_attn\.attn$", _gemma3_sliding_window_everywhere,
          prompts=[DEFAULT_PROMPTS[0] + " " + DEFAULT_PROMPTS[0], DEFAULT_PROMPTS[1]])
