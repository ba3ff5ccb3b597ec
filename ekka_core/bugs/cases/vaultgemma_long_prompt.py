"""Bug case ``vaultgemma-long-prompt``: Full-attention layers of a model with a `sliding_window` key treated as
sliding: prompts past the 512-token window go wrong. Same injection as ``gemma3-sliding-window-every-layer``."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.cases.gemma3_sliding_window_every_layer import _gemma3_sliding_window_everywhere
from ekka_core.bugs.prompts import LONG_PROMPT


BUG = Bug("vaultgemma-long-prompt", "gemma2",
          "Full-attention layers of a model with a `sliding_window` key treated as sliding: prompts past the 512-token "
          "window go wrong",
          "https://github.com/vllm-project/vllm/issues/49795 (fix https://github.com/vllm-project/vllm/pull/49803)",
          r"^model\.layers\.0\.self_attn\.attn$", _gemma3_sliding_window_everywhere,
          zoo_overrides={"layer_types": ["full_attention"] * 4, "sliding_window": 512,
                         "max_position_embeddings": 1024},
          requests=[{"id": "long", "prompt": LONG_PROMPT}], max_new_tokens=8)
