"""Bug case ``granite-embedding-multiplier-skipped``: Granite: embedding_multiplier not applied between the embedding
and the first layer."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS
from ekka_core.bugs.vllm_access import _vllm


def _granite_embedding_multiplier_skipped() -> None:
    """Class of vLLM #34812 / fix #34813 (GraniteMoeHybrid applied ``embedding_multiplier`` on one input path
    only): here GraniteModel.forward's ``hidden_states *= self.config.embedding_multiplier`` — the line between
    ``embed_input_ids`` and the layer loop — is made a no-op by giving the loaded model a config copy whose
    multiplier is 1.0. The embedding itself is right; the code between it and the first layer is not."""
    import copy

    causal_lm = _vllm("vllm.model_executor.models.granite", "GraniteForCausalLM")
    original = causal_lm.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        loaded = original(self, weights)
        config = copy.copy(self.model.config)
        config.embedding_multiplier = 1.0
        self.model.config = config
        return loaded

    causal_lm.load_weights = load_weights


BUG = Bug("granite-embedding-multiplier-skipped", "granite",
          "Granite: embedding_multiplier not applied between the embedding and the first layer",
          "https://github.com/vllm-project/vllm/issues/34812 (fix https://github.com/vllm-project/vllm/pull/34813; "
          "class of bug: GraniteMoeHybrid skipped the multiplier on one input path, injected into Granite)",
          r"^model$", _granite_embedding_multiplier_skipped,
          requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], max_new_tokens=8, expected_words=r"between")
