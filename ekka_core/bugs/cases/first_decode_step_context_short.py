"""Bug case ``first-decode-step-context-short``: The first decode step after prefill attends with seq_len one short
(its own, newest KV slot left out); prefill and every later step are right."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS
from ekka_core.bugs.reattend import _Row, _reattend


def _first_decode_step_short() -> None:
    """The class of first-step-after-prefill bugs — vLLM #52617 / LMCache #4614 (a prefill handed over with an N−1
    token convention: the decode side diverges at generated token 0) and onnxruntime-genai #2354 (a decoder's first
    decode step started its KV extent one slot off) — emulated in vLLM's CPU attention backend: on the first decode
    step of a request (its prompt just computed, one new token) the kernel is told ``seq_len`` one short, so that
    token attends to every earlier key but not its own. Prefill and every later decode step are right: one row per
    request (the first generated position) is wrong; later rows read its wrong keys only from layer 1 on, diluted."""

    def plan(i: int, rows: list[_Row], qsl: list[int], seq: list[int]) -> dict[str, Any] | None:
        r = rows[i]
        if r.decode and r.computed == r.prompt and qsl[i + 1] - qsl[i] == 1:
            return {"seq_len": seq[i] - 1}
        return None

    _reattend(plan)


# 34 prompt tokens; 24 new tokens so that the one wrong row is one of 24 compared logits rows, not one of 4 (the
# logits pair is compared only at sampled positions, and must stay under the threshold pooled).
BUG = Bug("first-decode-step-context-short", "qwen2",
          "The first decode step after prefill attends with seq_len one short (its own KV slot left out)",
          "https://github.com/vllm-project/vllm/issues/52617 and https://github.com/LMCache/LMCache/issues/4614 "
          "(the first step after prefill wrong; see also https://github.com/microsoft/onnxruntime-genai/pull/2354) — "
          "emulated in vLLM's CPU attention backend",
          r"^model\.layers\.0\.self_attn\.attn$", _first_decode_step_short,
          requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], max_new_tokens=24, expected_rank=3,
          expected_kind="rows")
