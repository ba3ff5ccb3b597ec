"""Bug case ``chat-double-bos``: LLM.chat tokenizes the rendered chat template with add_special_tokens=True: the
template's BOS is doubled."""

from __future__ import annotations

import functools
from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import CHAT_MESSAGES
from ekka_core.bugs.vllm_access import _vllm


def _chat_adds_special_tokens() -> None:
    """vLLM #55197 / fix #55288: ``LLM.chat`` tokenized the rendered chat template with ``add_special_tokens=True``
    (the multimodal processors' default), so a template that writes BOS itself got a second BOS. The fix made
    ``OfflineInferenceMixin._preprocess_chat`` default to ``add_special_tokens=False`` unless the caller asks;
    re-injected by restoring the pre-fix default (True) there — for every model, not just multimodal ones."""
    import inspect

    mixin = _vllm("vllm.entrypoints.common.offline", "OfflineInferenceMixin")
    original = _vllm("vllm.entrypoints.common.offline", "OfflineInferenceMixin", "_preprocess_chat")
    signature = inspect.signature(original)
    if "tokenization_kwargs" not in signature.parameters:
        raise RuntimeError("ekka bug injection: OfflineInferenceMixin._preprocess_chat takes no tokenization_kwargs")

    @functools.wraps(original)
    def _preprocess_chat(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["tokenization_kwargs"] = {"add_special_tokens": True,
                                                  **(bound.arguments.get("tokenization_kwargs") or {})}
        return original(*bound.args, **bound.kwargs)

    mixin._preprocess_chat = _preprocess_chat


BUG = Bug("chat-double-bos", "gemma", "LLM.chat tokenizes the rendered chat template with add_special_tokens=True: "
          "the template's BOS is doubled",
          "https://github.com/vllm-project/vllm/issues/55197 (fix https://github.com/vllm-project/vllm/pull/55288)",
          "", _chat_adds_special_tokens, messages=CHAT_MESSAGES, max_new_tokens=8,
          expected_verdict="inputs-differ")
