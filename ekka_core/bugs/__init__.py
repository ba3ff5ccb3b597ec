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

from ekka_core.contracts.errors import BadInput

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
    benchmark: bool = True            # False: a fault for tests, not a historical bug


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

    def _get_logits(self: Any, hidden_states: Any, lm_head: Any, *args: Any, **kwargs: Any) -> Any:
        head = getattr(self, "_ekka_head", None)
        if head is None:
            return original_get(self, hidden_states, lm_head, *args, **kwargs)
        return hidden_states @ head.to(hidden_states.device).t()

    lp.LogitsProcessor._get_logits = _get_logits


def _wrap_get_rope(module_name: str, **forced: Any) -> None:
    """Make a model file's ``get_rope`` ignore part of the config (the model file is where these bugs lived)."""
    import importlib

    mod = importlib.import_module(module_name)
    original = mod.get_rope

    def get_rope(*args: Any, **kwargs: Any) -> Any:
        for key, value in forced.items():
            kwargs[key] = value(kwargs.get(key)) if callable(value) else value
        return original(*args, **kwargs)

    mod.get_rope = get_rope


def _gptj_style_rotary() -> None:
    """vLLM #747 / fix #941: rotary applied in the wrong pairing style (NeoX half-split vs GPT-J interleaved)."""
    _wrap_get_rope("vllm.model_executor.models.llama", is_neox_style=False)


def _qwen2_yarn_ignored() -> None:
    """vLLM #4824 / fix #4930: Qwen2Attention dropped rope_scaling (YaRN), so plain RoPE was used."""
    def plain(params: Any) -> Any:
        return {"rope_type": "default", "rope_theta": (params or {}).get("rope_theta", 10000.0)}
    _wrap_get_rope("vllm.model_executor.models.qwen2", rope_parameters=plain)


def _qk_norm_across_heads() -> None:
    """vLLM #16300 / fix #16311 (Llama 4), injected into Qwen3's per-head q_norm: the RMS is taken over all heads
    of a token instead of over each head."""
    import torch
    from vllm.model_executor.models import qwen3

    original = qwen3.Qwen3Attention.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        norm = self.q_norm

        def forward(x: torch.Tensor, residual: Any = None) -> torch.Tensor:
            flat = x.float().reshape(*x.shape[:-2], -1)
            rms = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            return ((flat * rms).reshape(x.shape) * norm.weight.float()).to(x.dtype)

        norm.forward = forward

    qwen3.Qwen3Attention.__init__ = __init__


def _attention_bias_dropped() -> None:
    """vLLM #3767: LlamaAttention ignored `attention_bias`; the loader silently skipped the q/k/v bias tensors."""
    from vllm.model_executor.models import llama

    original = llama.LlamaAttention.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["bias"] = False
        kwargs["bias_o_proj"] = False
        original(self, *args, **kwargs)

    llama.LlamaAttention.__init__ = __init__
    original_load = llama.LlamaModel.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        return original_load(self, ((n, w) for n, w in weights if not n.endswith("_proj.bias")))

    llama.LlamaModel.load_weights = load_weights


def _moe_wrong_activation() -> None:
    """vLLM fix #41574 (Gemma 4 MoE: the fused experts got the wrong GELU); the same pattern — the fused-MoE
    experts built with a different activation than the model's — injected into Qwen3-MoE (exact GELU for SiLU)."""
    from vllm.model_executor.models import qwen3_moe

    original = qwen3_moe.FusedMoEFactory

    def factory(*args: Any, **kwargs: Any) -> Any:
        kwargs["activation"] = "gelu"
        return original(*args, **kwargs)

    qwen3_moe.FusedMoEFactory = factory


def _lm_head_wrongly_tied() -> None:
    """vLLM #51063: Mistral3 wrapper resolved tie_word_embeddings from the wrong config, discarding the
    checkpoint's real lm_head.weight in favour of the embedding matrix."""
    import torch
    from vllm.model_executor.models import mistral

    original = mistral.MistralForCausalLM.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        loaded = original(self, weights)
        with torch.no_grad():
            self.lm_head.weight.copy_(self.model.embed_tokens.weight)
        return loaded

    mistral.MistralForCausalLM.load_weights = load_weights


def _decode_kernel_wrong_scale() -> None:
    """Emulates the class of SGLang #13044 (a FlashInfer attention kernel wrong on one path, right on the other):
    the decode-only attention path uses a wrong softmax scale. Prefill is untouched, so the divergence must start
    at the first decode step."""
    from vllm.v1.attention.backends import cpu_attn

    original = cpu_attn.CPUAttentionBackendImpl.forward

    def forward(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, attn_metadata: Any,
                *args: Any, **kwargs: Any) -> Any:
        if attn_metadata is None or attn_metadata.max_query_len != 1:
            return original(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        scale = self.scale
        self.scale = scale * 1.5
        try:
            return original(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        finally:
            self.scale = scale

    cpu_attn.CPUAttentionBackendImpl.forward = forward


def _crash_mid_run() -> None:
    """Not a historical bug: the engine dies at its third forward step (tests that partial traces are kept)."""
    from vllm.model_executor.layers import logits_processor as lp

    original = lp.LogitsProcessor.forward
    calls = {"n": 0}

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise RuntimeError("injected engine crash (ekka test fault)")
        return original(self, *args, **kwargs)

    lp.LogitsProcessor.forward = forward


BUGS: dict[str, Bug] = {b.name: b for b in [
    Bug("gemma3-sliding-window-every-layer", "gemma3_text",
        "Gemma 3: interleaved sliding window not detected, global layers use the local window",
        "https://github.com/vllm-project/vllm/issues/17689 (fix https://github.com/vllm-project/vllm/pull/21927)",
        r"^model\.layers\.3\.self_attn\.attn$", _gemma3_sliding_window_everywhere,
        prompts=[DEFAULT_PROMPTS[0] + " " + DEFAULT_PROMPTS[0], DEFAULT_PROMPTS[1]]),
    # Exact vs tanh GELU differ by ~1e-3 relative on this tiny model's activations — below bf16 rounding (4e-3),
    # far above fp32's: a subtle bug is diagnosed in fp32, where the reference's own noise is ~1e-6.
    Bug("gemma-exact-gelu", "gemma", "Gemma: exact GELU instead of tanh-approximate GELU",
        "https://github.com/vllm-project/vllm/issues/3411 (fix https://github.com/vllm-project/vllm/pull/3653)",
        r"^model\.layers\.0\.mlp\.act_fn$", _gemma_exact_gelu, dtype="float32"),
    Bug("gemma-untied-lm-head", "gemma", "tie_word_embeddings ignored: lm_head not loaded",
        "https://github.com/vllm-project/vllm/issues/5621 (fix https://github.com/vllm-project/vllm/pull/5724)",
        r"logits_processor$", _untied_lm_head),
    Bug("vaultgemma-full-attention-windowed", "gemma2",
        "Full-attention layers of a model with a `sliding_window` key treated as sliding-window layers",
        "https://github.com/vllm-project/vllm/issues/49795 (fix https://github.com/vllm-project/vllm/pull/49803)",
        r"^model\.layers\.0\.self_attn\.attn$", _gemma3_sliding_window_everywhere,
        zoo_overrides={"layer_types": ["full_attention"] * 4},
        prompts=[DEFAULT_PROMPTS[0] + " " + DEFAULT_PROMPTS[0], DEFAULT_PROMPTS[1]]),
    Bug("llama-gptj-style-rotary", "llama", "Rotary embedding applied in the wrong pairing style",
        "https://github.com/vllm-project/vllm/issues/747 (fix https://github.com/vllm-project/vllm/pull/941)",
        r"^model\.layers\.0\.self_attn\.rotary_emb$", _gptj_style_rotary),
    Bug("qwen2-yarn-ignored", "qwen2", "Qwen2: rope_scaling (YaRN) silently ignored",
        "https://github.com/vllm-project/vllm/issues/4824 (fix https://github.com/vllm-project/vllm/pull/4930)",
        r"^model\.layers\.0\.self_attn\.rotary_emb$", _qwen2_yarn_ignored,
        zoo_overrides={"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                           "original_max_position_embeddings": 128}}),
    Bug("qwen3-qk-norm-across-heads", "qwen3", "QK-norm computed across all heads instead of per head",
        "https://github.com/vllm-project/vllm/issues/16300 (fix https://github.com/vllm-project/vllm/pull/16311)",
        r"^model\.layers\.0\.self_attn\.q_norm$", _qk_norm_across_heads),
    Bug("llama-attention-bias-dropped", "llama", "Llama: attention_bias ignored, q/k/v biases silently dropped",
        "https://github.com/vllm-project/vllm/pull/3767",
        r"^model\.layers\.0\.self_attn\.qkv_proj$", _attention_bias_dropped,
        zoo_overrides={"attention_bias": True}),
    Bug("qwen3-moe-experts-wrong-activation", "qwen3_moe",
        "Fused MoE experts built with the wrong activation (exact GELU)",
        "https://github.com/vllm-project/vllm/pull/41574 (pattern; injected into Qwen3-MoE)",
        r"^model\.layers\.0\.mlp\.experts$", _moe_wrong_activation),
    Bug("mistral-lm-head-wrongly-tied", "mistral",
        "tie_word_embeddings resolved from the wrong config: real lm_head replaced by the embeddings",
        "https://github.com/vllm-project/vllm/issues/51063",
        r"logits_processor$", _lm_head_wrongly_tied),
    Bug("decode-attention-kernel-wrong-scale", "qwen2",
        "Decode-only attention kernel path wrong (emulated: softmax scale ×1.5 on decode steps)",
        "https://github.com/sgl-project/sglang/issues/13044 (pattern: attention kernel wrong on one path)",
        r"^model\.layers\.0\.self_attn\.attn$", _decode_kernel_wrong_scale),
    Bug("engine-crash-mid-run", "llama", "test fault: the engine raises at its third step", "(none)",
        r"$^", _crash_mid_run, benchmark=False),
]}


def get(name: str) -> Bug:
    if name not in BUGS:
        raise BadInput(f"unknown bug {name!r}", fix=f"use one of: {', '.join(sorted(BUGS))}")
    return BUGS[name]


def matches(bug: Bug, module: str) -> bool:
    return re.search(bug.expected, module) is not None
