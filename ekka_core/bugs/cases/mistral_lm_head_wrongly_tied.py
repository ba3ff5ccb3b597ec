"""Bug case ``mistral-lm-head-wrongly-tied``: tie_word_embeddings resolved from the wrong config: real lm_head replaced
by the embeddings."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _lm_head_wrongly_tied() -> None:
    """vLLM #51063: Mistral3 wrapper resolved tie_word_embeddings from the wrong config, discarding the
    checkpoint's real lm_head.weight in favour of the embedding matrix."""
    import torch

    mistral = vllm_compat().model_module("mistral")

    original = mistral.MistralForCausalLM.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        loaded = original(self, weights)
        with torch.no_grad():
            self.lm_head.weight.copy_(self.model.embed_tokens.weight)
        return loaded

    mistral.MistralForCausalLM.load_weights = load_weights


BUG = Bug("mistral-lm-head-wrongly-tied", "mistral",
          "tie_word_embeddings resolved from the wrong config: real lm_head replaced by the embeddings",
          "https://github.com/vllm-project/vllm/issues/51063",
          r"logits_processor$", _lm_head_wrongly_tied)
