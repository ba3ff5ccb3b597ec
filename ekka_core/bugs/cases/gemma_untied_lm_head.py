"""Bug case ``gemma-untied-lm-head``: tie_word_embeddings ignored: lm_head not loaded."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _untied_lm_head() -> None:
    """vLLM #5621 / fix #5724: tie_word_embeddings ignored, lm_head never loaded from embed_tokens."""
    import torch

    gemma = vllm_compat().model_module("gemma")

    original = gemma.GemmaForCausalLM.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        loaded = original(self, weights)
        with torch.no_grad():  # what an unloaded lm_head holds: whatever initialisation left there
            g = torch.Generator().manual_seed(0)
            head = torch.randn(self.model.embed_tokens.weight.shape, generator=g) * 0.02
            self.logits_processor._ekka_head = head.to(self.model.embed_tokens.weight.dtype)
        return loaded

    gemma.GemmaForCausalLM.load_weights = load_weights

    lp = vllm_compat().logits_processor_module()

    original_get = lp.LogitsProcessor._get_logits

    def _get_logits(self: Any, hidden_states: Any, lm_head: Any, *args: Any, **kwargs: Any) -> Any:
        head = getattr(self, "_ekka_head", None)
        if head is None:
            return original_get(self, hidden_states, lm_head, *args, **kwargs)
        return hidden_states @ head.to(hidden_states.device).t()

    lp.LogitsProcessor._get_logits = _get_logits


BUG = Bug("gemma-untied-lm-head", "gemma", "tie_word_embeddings ignored: lm_head not loaded",
          "https://github.com/vllm-project/vllm/issues/5621 (fix https://github.com/vllm-project/vllm/pull/5724)",
          r"logits_processor$", _untied_lm_head)
