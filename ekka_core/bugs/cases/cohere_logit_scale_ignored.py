"""Bug case ``cohere-logit-scale-ignored``: Command-R's logits produced without its ``logit_scale``."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import force_kwargs


def _logit_scale_ignored() -> None:
    """vLLM #3433 (adding Command-R; review: "the implementation doesn't use the `logit_scale` from the model's
    config … the model becomes increasingly deterministic"): the logits left unscaled. Re-injected into vLLM's
    commandr model, whose LogitsProcessor is built with ``scale=config.logit_scale``."""
    force_kwargs("vllm.model_executor.models.commandr", "LogitsProcessor", scale=1.0)


BUG = Bug("cohere-logit-scale-ignored", "sweep:cohere", "Cohere (Command-R): logits without the config's logit_scale",
          "https://github.com/vllm-project/vllm/pull/3433 (review; injected into vLLM's commandr)",
          r"^logits_processor$", _logit_scale_ignored)
