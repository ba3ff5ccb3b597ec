"""Bug case ``prefix-cache-hit-corrupts-resumed-prefill``: A prefill resumed from a prefix-cache hit reads its cached
context wrongly (misses are right)."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import SHARED_PREFIX
from ekka_core.bugs.reattend import _reattend


def _prefix_hit_misread() -> None:
    """tenstorrent/vllm #415 (prefix-cache hits return corrupted KV: the prefill that resumes from cached KV,
    num_computed_tokens > 0, is wrong; misses are right; see also vLLM #5543, #7845). Emulated in the CPU
    attention backend: on the step a request is first scheduled with its context served from the prefix cache,
    its attention reads the context as if its new tokens started at position 0 (kernel told seq_len = its query
    length), i.e. it reads the first cached slots instead of the cached prefix plus itself. A fresh prefill, a
    chunked continuation and every decode are right."""
    _reattend(lambda i, rows, qsl, seq: {"seq_len": qsl[i + 1] - qsl[i]} if rows[i].cache_hit else None)


# whole prompts in one chunk, one request at a time) ---------------------------------------------------------
BUG = Bug("prefix-cache-hit-corrupts-resumed-prefill", "llama",
          "A prefill resumed from a prefix-cache hit reads its cached context wrongly (misses are right)",
          "https://github.com/tenstorrent/vllm/issues/415 (analogue in vLLM's CPU attention backend; see also "
          "https://github.com/vllm-project/vllm/issues/5543, https://github.com/vllm-project/vllm/issues/7845)",
          r"^model\.layers\.0\.self_attn\.attn$", _prefix_hit_misread,
          requests=[{"id": "a", "prompt": SHARED_PREFIX + " Question: what jumps over the lazy dog?"},
                    {"id": "b", "prompt": SHARED_PREFIX + " Question: what is the capital of Italy?", "after": "a"}],
          max_new_tokens=8, expected_rank=3, expected_culprit=["prefix_caching"])
