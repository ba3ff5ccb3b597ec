"""Bug case ``gemma-normalizer-fp32``: Gemma: embedding normaliser sqrt(hidden) kept in fp32 instead of rounded to the
model dtype."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS
from ekka_core.bugs.vllm_access import _vllm


def _gemma_normalizer_fp32() -> None:
    """HF transformers #29402 and google/gemma_pytorch #67: Gemma's embedding normaliser sqrt(hidden_size) must be
    rounded to the model dtype before it multiplies the embeddings (that is how Gemma was trained); vLLM's
    GemmaModel keeps it as a bf16 buffer. Re-injected the other way round: the embeddings are scaled by the fp32
    normaliser and rounded once (closer to fp32 than the reference). Only visible when sqrt(hidden) is not exact in
    bf16 (hidden 256 → 16.0 is)."""
    import torch

    model = _vllm("vllm.model_executor.models.gemma", "GemmaModel")
    _vllm("vllm.model_executor.models.gemma", "GemmaModel", "embed_input_ids")

    def embed_input_ids(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        return (embeds.to(torch.float32) * float(self.config.hidden_size) ** 0.5).to(embeds.dtype)

    model.embed_input_ids = embed_input_ids


BUG = Bug("gemma-normalizer-fp32", "gemma",
          "Gemma: embedding normaliser sqrt(hidden) kept in fp32 instead of rounded to the model dtype",
          "https://github.com/huggingface/transformers/pull/29402 and https://github.com/google/gemma_pytorch/pull/67 "
          "(analogue: the rounding HF and Gemma use, inverted in vLLM's GemmaModel.embed_input_ids)",
          r"^model(\.embed_tokens)?$", _gemma_normalizer_fp32,
          zoo_overrides={"hidden_size": 384}, requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}],
          engine_args={"enforce_eager": True}, max_new_tokens=8, expected_rank=3, expected_words=r"closer to fp32")
