"""The zoo's recipes: the HF config of every architecture Ekka supports, the tokenizer's training text, and the
hash of both that names a model's cache directory (changing a recipe or ``ZOO_VERSION`` changes it)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from ekka_core.contracts.errors import BadInput

# Bump when the build procedure itself changes (not needed for recipe edits: they are hashed).
ZOO_VERSION = 5

# Shared by every recipe: small enough to run on two CPU cores in seconds, large enough for vLLM's CPU kernels
# (head_dim 64: the CPU attention backend rejects 16) and for sliding windows to be exceeded by a 64-token prompt.
_BASE: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    # Larger than HF's 0.02 so that random logits are peaked enough for greedy decoding to be stable
    # across frameworks (near-ties would make fp32 HF and vLLM pick different tokens by rounding alone).
    "initializer_range": 0.08,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

# Real checkpoints declare the dtype they are served in; so do the zoo's (weights are stored in fp32).
CHECKPOINT_DTYPE = "bfloat16"

# A chat template of the usual shape: the template writes BOS itself, so a chat prompt must be tokenized without
# adding special tokens again (vLLM #55197: LLM.chat doubled BOS exactly there).
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")

SLIDING_WINDOW = 16
# Gemma multiplies its (tied) embeddings by sqrt(hidden): with random weights a token's own embedding then dominates
# both the residual stream and the output layer, and the model only echoes its last input token — hiding
# attention bugs from generation. Shrinking the embedding matrix gives attention a say. (Zoo-only recipe key.)
GEMMA_EMBED_SCALE = 0.125

RECIPES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]},
    # Mistral's sliding window on every layer (unlike Llama, which it otherwise equals at this size).
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": SLIDING_WINDOW},
    "gemma": {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "tie_word_embeddings": True,
              "_embed_scale": GEMMA_EMBED_SCALE,
              "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh"},
    "gemma2": {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "tie_word_embeddings": True,
               "_embed_scale": GEMMA_EMBED_SCALE,
               "sliding_window": SLIDING_WINDOW, "query_pre_attn_scalar": 64,
               "layer_types": ["sliding_attention", "full_attention"] * 2,
               # Random-init logits are O(1): caps of this size actually clip, so soft-capping is exercised.
               "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0},
    "gemma3_text": {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "tie_word_embeddings": True,
                    "_embed_scale": GEMMA_EMBED_SCALE,
                    "sliding_window": SLIDING_WINDOW, "query_pre_attn_scalar": 64,
                    # Gemma 3's local:global pattern, shortened: layer 3 is the global (full-attention) layer.
                    "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "sliding_window": None},
    "granite": {"model_type": "granite", "architectures": ["GraniteForCausalLM"],
                "embedding_multiplier": 4.0, "residual_multiplier": 0.5, "attention_multiplier": 0.125,
                "logits_scaling": 2.0},
    "qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                  "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": []},
    # A shared expert (gated by a sigmoid of its own linear) beside the routed experts; vLLM's fused-MoE runner calls
    # it from inside `experts`. Unrenormalised top-k, as the released Qwen1.5/Qwen2-MoE checkpoints.
    "qwen2_moe": {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                  "shared_expert_intermediate_size": 256, "decoder_sparse_step": 1, "norm_topk_prob": False,
                  "mlp_only_layers": [], "use_sliding_window": False},
}

# Text the tokenizer is trained on. Any fixed text works; this one resembles the prompts tests use.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A serving engine answers a prompt token by token.
Silent errors do not crash: the model still answers, but worse. Attention looks back over the context window.
Sliding window attention only sees the most recent tokens, while global attention sees them all.
Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in many prompts, as do questions and answers.
Once upon a time there was a small model that learned to count, to rhyme and to tell long stories.
The capital of France is Paris. The capital of Italy is Rome. Water boils at one hundred degrees.
def add(a, b): return a + b  # code is text too, with brackets, colons and comments.
"""


def known_architectures() -> list[str]:
    """The hand-written recipes (the architectures Ekka is tuned to). ``sweep:<model_type>`` names a generated one
    (:mod:`ekka_core.zoo.sweep`)."""
    return sorted(RECIPES)


def recipe(arch: str) -> dict[str, Any]:
    """The full HF config dict for ``arch`` (the base merged with the architecture's overrides); for
    ``sweep:<model_type>`` the recipe generated from the installed HF config class (not merged with the base: its
    sizes come from the class's own attribute names)."""
    if arch.startswith("sweep:"):
        from ekka_core.zoo.sweep import generated_recipe

        return generated_recipe(arch.removeprefix("sweep:"))
    if arch not in RECIPES:
        raise BadInput(
            f"unknown zoo architecture {arch!r}",
            fix=f"use one of: {', '.join(known_architectures())}",
        )
    merged = copy.deepcopy(_BASE)
    merged.update(copy.deepcopy(RECIPES[arch]))
    return merged


def recipe_hash(arch: str, overrides: dict[str, Any] | None = None) -> str:
    blob = json.dumps({"v": ZOO_VERSION, "config": recipe(arch), "overrides": overrides or {},
                       "corpus": _CORPUS, "dtype": CHECKPOINT_DTYPE, "chat": CHAT_TEMPLATE}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
