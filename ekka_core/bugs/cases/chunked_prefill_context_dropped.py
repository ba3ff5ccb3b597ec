"""Bug case ``chunked-prefill-context-dropped``: A prefill chunk after the first ignores the KV cache of the earlier
chunks."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import CHUNKED_PROMPT
from ekka_core.bugs.reattend import _reattend


def _chunked_prefill_context_dropped() -> None:
    """Analogue of vLLM #26042 (MLA output wrong with chunked prefill, worse with smaller chunks) and PR #36580
    (slot mapping for chunked prefill, "cause of insidious correctness issues"): a prefill chunk after the first
    attends only to its own tokens — the KV its earlier chunks left in the cache is ignored. A prompt processed in
    one chunk, prefix-cache hits and decodes are right."""
    _reattend(lambda i, rows, qsl, seq: {"own_tokens_only": True} if rows[i].continuation else None)


BUG = Bug("chunked-prefill-context-dropped", "qwen3",
          "A prefill chunk after the first ignores the KV cache of the earlier chunks",
          "https://github.com/vllm-project/vllm/issues/26042 and https://github.com/vllm-project/vllm/pull/36580 "
          "(analogue in vLLM's CPU attention backend)",
          r"^model\.layers\.0\.self_attn\.attn$", _chunked_prefill_context_dropped,
          requests=[{"id": "a", "prompt": CHUNKED_PROMPT}], engine_args={"max_num_batched_tokens": 64},
          max_new_tokens=8, expected_rank=3, expected_culprit=["chunked_prefill"])
