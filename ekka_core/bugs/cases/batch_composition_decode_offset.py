"""Bug case ``batch-composition-decode-offset``: In a batch of several requests, decodes after the first read the
previous request's KV cache."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS
from ekka_core.bugs.reattend import _Row, _reattend


def _batch_decode_reads_previous_row() -> None:
    """Analogue of the class of vLLM #5607 / fix #5639 (a request's output depended on what else was in the
    batch), at module level: in a step with several requests, every decoding request after the first reads the
    block-table row of the request before it (the wrong sequence's KV cache, up to the shorter of the two
    lengths). A request alone in its step — one at a time — is right."""
    def plan(i: int, rows: list[_Row], qsl: list[int], seq: list[int]) -> dict[str, Any] | None:
        if i == 0 or not rows[i].decode:
            return None
        return {"block_row": i - 1, "seq_len": min(seq[i], seq[i - 1])}

    _reattend(plan)


BUG = Bug("batch-composition-decode-offset", "phi3",
          "In a batch of several requests, decodes after the first read the previous request's KV cache",
          "https://github.com/vllm-project/vllm/issues/5607 (fix https://github.com/vllm-project/vllm/pull/5639; "
          "analogue of the class — output depends on the batch — in vLLM's CPU attention backend)",
          r"^model\.layers\.0\.self_attn\.attn$", _batch_decode_reads_previous_row,
          requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}, {"id": "b", "prompt": DEFAULT_PROMPTS[1]}],
          max_new_tokens=8, expected_rank=3, expected_culprit=["batching"])
