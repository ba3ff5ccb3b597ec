"""Bug case ``cohere-logit-scale-ignored``: Command-R's logits produced without its ``logit_scale``."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _logit_scale_ignored() -> None:
    """vLLM #3433 (adding Command-R; review: "the implementation doesn't use the `logit_scale` from the model's
    config … the model becomes increasingly deterministic"): the logits left unscaled. Re-injected into vLLM's
    commandr model, whose LogitsProcessor is built with ``scale=config.logit_scale``."""
    commandr = vllm_compat().model_module("commandr")
    original = commandr.LogitsProcessor

    def logits_processor(*args: Any, **kwargs: Any) -> Any:
        kwargs["scale"] = 1.0
        return original(*args, **kwargs)

    commandr.LogitsProcessor = logits_processor


BUG = Bug("cohere-logit-scale-ignored", "sweep:cohere", "Cohere (Command-R): logits without the config's logit_scale",
          "https://github.com/vllm-project/vllm/pull/3433 (review; injected into vLLM's commandr)",
          r"^logits_processor$", _logit_scale_ignored)
