"""Bug case ``vaultgemma-full-attention-windowed``: Full-attention layers of a model with a `sliding_window` key
treated as sliding-window layers. Same injection as ``gemma3-sliding-window-every-layer``."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.cases.gemma3_sliding_window_every_layer import _gemma3_sliding_window_everywhere
from ekka_core.bugs.prompts import DEFAULT_PROMPTS


BUG = Bug("vaultgemma-full-attention-windowed", "gemma2",
          "Full-attention layers of a model with a `sliding_window` key treated as sliding-window layers",
          "https://github.com/vllm-project/vllm/issues/49795 (fix https://github.com/vllm-project/vllm/pull/49803)",
          r"^model\.layers\.0\.self_attn\.attn$", _gemma3_sliding_window_everywhere,
          zoo_overrides={"layer_types": ["full_attention"] * 4},
          prompts=[DEFAULT_PROMPTS[0] + " " + DEFAULT_PROMPTS[0], DEFAULT_PROMPTS[1]])
