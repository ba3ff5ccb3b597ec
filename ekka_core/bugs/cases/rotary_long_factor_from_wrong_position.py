"""Bug case ``rotary-long-factor-from-wrong-position``: LongRoPE's long-context factors applied from a position far
below the switch point, so the last positions (the last decode steps) rotate slightly wrong."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import CHUNKED_PROMPT
from ekka_core.bugs.vllm_access import _vllm

SWITCH = 255        # the (wrong) position from which the long factors are applied
LONG = 0.0165       # the long factors: 1 on the highest-frequency pair … 1 + LONG on the lowest (LongRoPE's shape)


def _long_factor_from_wrong_position() -> None:
    """The class of vLLM #27414 (fix #27431; also #19489, Phi-3.5 / Phi-4-mini): LongRoPE keeps a short-factor and
    a long-factor rotary table and vLLM picked between them per position — positions past the switch rotated with
    the long factors while the reference (HF picks by sequence length) still used the short ones. Emulated on
    Phi-3's rotary table: positions from ``SWITCH`` on rotate with long factors 1 … 1+``LONG`` (the short factors
    are 1) — far below any real switch point, so only the last positions of the request (its last two decode steps)
    are wrong. Both rotary implementations (the compiled default's forward_native, eager's C++ kernel) read this
    table."""
    import torch

    rotary = _vllm("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding")
    original = rotary._compute_cos_sin_cache

    def _compute_cos_sin_cache(self: Any) -> Any:
        cache = original(self)
        inv_freq = self._compute_inv_freq(self.base)
        half = inv_freq.numel()
        long_factor = 1.0 + LONG * torch.arange(half, dtype=torch.float) / max(half - 1, 1)
        t = torch.arange(SWITCH, self.max_position_embeddings, dtype=torch.float)
        freqs = torch.einsum("i,j -> ij", t, inv_freq / long_factor)
        cache[SWITCH:] = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        return cache

    rotary._compute_cos_sin_cache = _compute_cos_sin_cache


# 210 prompt tokens and 48 new ones: positions 0–256 are computed, the last two (255, 256) past SWITCH — 2 of 257
# rows, and 2 of the 48 sampled positions the logits pair and the served output check compare.
BUG = Bug("rotary-long-factor-from-wrong-position", "phi3",
          "LongRoPE long factors applied from the wrong position: the last positions (decode steps) rotate slightly "
          "wrong",
          "https://github.com/vllm-project/vllm/issues/27414 (fix https://github.com/vllm-project/vllm/pull/27431; "
          "also https://github.com/vllm-project/vllm/issues/19489) — emulated: long factors from a position below "
          "the switch point, on Phi-3's rotary table",
          r"^model\.layers\.0\.self_attn\.rotary_emb$", _long_factor_from_wrong_position,
          requests=[{"id": "a", "prompt": CHUNKED_PROMPT}], max_new_tokens=48, expected_rank=3,
          expected_kind="rows")
