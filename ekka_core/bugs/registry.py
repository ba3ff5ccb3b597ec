"""The bug registry: every case module under :mod:`ekka_core.bugs.cases`, by name, in a fixed order.

A case is selected by ``EKKA_INJECT_BUG=<name>`` in the engine's environment; Ekka's vLLM plugin injects it
(:mod:`ekka_core.capture.vllm_plugin`). The order of :data:`BUGS` is the order of the benchmark tables: a case
module missing from :data:`ORDER` is still registered, after the listed ones (by module name).
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from ekka_core.bugs import cases
from ekka_core.bugs.bug import Bug
from ekka_core.contracts.errors import BadInput

ENV_VAR = "EKKA_INJECT_BUG"

# Case modules in benchmark-table order.
ORDER = (
    "gemma3_sliding_window_every_layer",
    "gemma_exact_gelu",
    "gemma_untied_lm_head",
    "vaultgemma_full_attention_windowed",
    "llama_gptj_style_rotary",
    "qwen2_yarn_ignored",
    "llama_attention_bias_dropped",
    "qwen3_qk_norm_across_heads",
    "qwen3_moe_experts_wrong_activation",
    "mistral_lm_head_wrongly_tied",
    "decode_attention_kernel_wrong_scale",
    # --- issue 15: Ekka observed something other than what ran
    "chat_double_bos",
    "granite_embedding_multiplier_skipped",
    "rmsnorm_weight_in_fp32",
    "gemma_normalizer_fp32",
    "vaultgemma_long_prompt",
    # --- issue 16: bugs that show only under a served feature (the traced baseline is eager, no prefix cache,
    # whole prompts in one chunk, one request at a time)
    "prefix_cache_hit_corrupts_resumed_prefill",
    "chunked_prefill_context_dropped",
    "compiled_default_rotary_native",
    "batch_composition_decode_offset",
    # --- issue 23: bugs confined to a few rows (a pooled ratio under the threshold; the row-level check names them),
    # and an fp16 overflow to Inf on a few rows (the non-finite check)
    "rmsnorm_tail_rows_wrong",
    "rotary_long_factor_from_wrong_position",
    "first_decode_step_context_short",
    "mlp_fp16_overflow_prescaled_down_proj",
    # --- issue 24: real bug classes in architectures outside the first zoo, each in its own block
    "qwen2_moe_shared_expert_gate_dropped",
    "mixtral_router_weights_not_renormalised",
    "cohere_logit_scale_ignored",
    "falcon_parallel_mlp_own_layernorm",
    # --- issue 26: compile-only bugs, clean under enforce_eager, localised inside the compiled graph
    "inductor_silu_decomposition_wrong",
    "fusion_pass_norm_wrong_operand",
    # --- test faults, not historical bugs
    "engine_crash_mid_run",
)


def case_modules() -> list[str]:
    """The case modules found under :mod:`ekka_core.bugs.cases`, :data:`ORDER` first."""
    found = {m.name for m in pkgutil.iter_modules(cases.__path__) if not m.ispkg}
    return [m for m in ORDER if m in found] + sorted(found - set(ORDER))


BUGS: dict[str, Bug] = {b.name: b for b in (importlib.import_module(f"{cases.__name__}.{m}").BUG
                                            for m in case_modules())}


def get(name: str) -> Bug:
    """The registered case ``name``, or a generic injected bug named by its parameters
    (``scale-output:<module>:<factor>``, :mod:`ekka_core.bugs.generic`)."""
    from ekka_core.bugs import generic

    if generic.is_generic(name):
        return generic.get(name)
    if name not in BUGS:
        raise BadInput(f"unknown bug {name!r}", fix=f"use one of: {', '.join(sorted(BUGS))} (or a generic "
                                                    f"{generic.SCALE_OUTPUT}:<module>:<factor>)")
    return BUGS[name]


def matches(bug: Bug, module: str) -> bool:
    return re.search(bug.expected, module) is not None
