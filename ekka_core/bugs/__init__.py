"""Real historical silent errors of vLLM, re-injected into the installed vLLM for demos and the benchmark.

Each bug names its source (issue / fix PR), the zoo architecture that shows it, and the component a correct
diagnosis must rank first. Injection happens inside vLLM's own processes through Ekka's ``vllm.general_plugins``
entry point (:mod:`ekka_core.capture.vllm_plugin`), selected by ``EKKA_INJECT_BUG=<name>``; nothing is edited on
disk and no other plugin is affected.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ekka_core.errors import BadInput

ENV_VAR = "EKKA_INJECT_BUG"


@dataclass
class Bug:
    name: str
    arch: str
    title: str
    source: str
    expected: str                     # regex the rank-1 suspect's module path must match
    inject: Callable[[], None]
    zoo_overrides: dict[str, Any] = field(default_factory=dict)
    dtype: str = "bfloat16"
    prompts: list[str] = field(default_factory=list)


DEFAULT_PROMPTS = [
    "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories. "
    "The capital of France is Paris.",
    "Sliding window attention only sees the most recent tokens",
]


def _gemma3_sliding_window_everywhere() -> None:
    """vLLM #17689 / fix #21927: interleaved sliding window not detected, so the global layers also got the
    model-level window (Attention falls back to the model's sliding_window when its own is None)."""
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.attention import attention as attention_mod

    original = attention_mod.Attention.__init__

    @functools.wraps(original)
    def __init__(self, *args: Any, per_layer_sliding_window: int | None = None, **kwargs: Any) -> None:
        hf = get_current_vllm_config().model_config.hf_text_config
        if per_layer_sliding_window is None and getattr(hf, "sliding_window", None):
            per_layer_sliding_window = hf.sliding_window
        original(self, *args, per_layer_sliding_window=per_layer_sliding_window, **kwargs)

    attention_mod.Attention.__init__ = __init__


def _gemma_exact_gelu() -> None:
    """vLLM #3411 / fix #3653: Gemma's gated MLP used exact (erf) GELU instead of tanh-approximate GELU."""
    from vllm.model_executor.layers.activation import GeluAndMul
    from vllm.model_executor.models import gemma

    gemma._get_gemma_act_fn = lambda *a, **k: GeluAndMul(approximate="none")


def _untied_lm_head() -> None:
    """vLLM #5621 / fix #5724: tie_word_embeddings ignored, lm_head never loaded from embed_tokens."""
    import torch
    from vllm.model_executor.models import gemma

    original = gemma.GemmaForCausalLM.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        loaded = original(self, weights)
        with torch.no_grad():  # what an unloaded lm_head holds: whatever initialisation left there
            g = torch.Generator().manual_seed(0)
            head = torch.randn(self.model.embed_tokens.weight.shape, generator=g) * 0.02
            self.logits_processor._ekka_head = head.to(self.model.embed_tokens.weight.dtype)
        return loaded

    gemma.GemmaForCausalLM.load_weights = load_weights
    from vllm.model_executor.layers import logits_processor as lp

    original_get = lp.LogitsProcessor._get_logits

    def _get_logits(self: Any, hidden_states: Any, lm_head: Any, embedding_bias: Any) -> Any:
        head = getattr(self, "_ekka_head", None)
        if head is None:
            return original_get(self, hidden_states, lm_head, embedding_bias)
        return hidden_states @ head.to(hidden_states.device).t()

    lp.LogitsProcessor._get_logits = _get_logits


BUGS: dict[str, Bug] = {b.name: b for b in [
    Bug("gemma3-sliding-window-every-layer", "gemma3_text",
        "Gemma 3: interleaved sliding window not detected, global layers use the local window",
        "https://github.com/vllm-project/vllm/issues/17689 (fix https://github.com/vllm-project/vllm/pull/21927)",
        r"^model\.layers\.3\.self_attn\.attn$", _gemma3_sliding_window_everywhere,
        prompts=[DEFAULT_PROMPTS[0] + " " + DEFAULT_PROMPTS[0], DEFAULT_PROMPTS[1]]),
    Bug("gemma-exact-gelu", "gemma", "Gemma: exact GELU instead of tanh-approximate GELU",
        "https://github.com/vllm-project/vllm/issues/3411 (fix https://github.com/vllm-project/vllm/pull/3653)",
        r"^model\.layers\.0\.mlp\.act_fn$", _gemma_exact_gelu),
    Bug("gemma-untied-lm-head", "gemma", "tie_word_embeddings ignored: lm_head not loaded",
        "https://github.com/vllm-project/vllm/issues/5621 (fix https://github.com/vllm-project/vllm/pull/5724)",
        r"logits_processor$", _untied_lm_head),
]}


def get(name: str) -> Bug:
    if name not in BUGS:
        raise BadInput(f"unknown bug {name!r}", fix=f"use one of: {', '.join(sorted(BUGS))}")
    return BUGS[name]


def matches(bug: Bug, module: str) -> bool:
    return re.search(bug.expected, module) is not None
