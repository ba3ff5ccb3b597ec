"""Tiny model zoo: deterministic random-weight HF checkpoints with a locally trained tokenizer.

Every architecture Ekka supports has a recipe here. Tests, benchmarks and the demo build models from these
recipes instead of downloading anything. A model is cached on disk under a directory named after the hash of its
recipe, so changing a recipe (or ``ZOO_VERSION``) rebuilds it and never serves a stale checkpoint.

    >>> from ekka_core.zoo import build_model
    >>> path = build_model("gemma3_text")       # ~/.cache/ekka/zoo/gemma3_text-<hash>/
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
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
    return sorted(RECIPES)


def recipe(arch: str) -> dict[str, Any]:
    """The full HF config dict for ``arch`` (the base merged with the architecture's overrides)."""
    if arch not in RECIPES:
        raise BadInput(
            f"unknown zoo architecture {arch!r}",
            fix=f"use one of: {', '.join(known_architectures())}",
        )
    merged = copy.deepcopy(_BASE)
    merged.update(copy.deepcopy(RECIPES[arch]))
    return merged


def zoo_dir() -> Path:
    return Path(os.environ.get("EKKA_ZOO_DIR", Path.home() / ".cache" / "ekka" / "zoo"))


def recipe_hash(arch: str, overrides: dict[str, Any] | None = None) -> str:
    blob = json.dumps({"v": ZOO_VERSION, "config": recipe(arch), "overrides": overrides or {},
                       "corpus": _CORPUS, "dtype": CHECKPOINT_DTYPE, "chat": CHAT_TEMPLATE}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_model(arch: str, *, overrides: dict[str, Any] | None = None, seed: int = 0,
                root: Path | None = None) -> Path:
    """Build (or reuse) the tiny checkpoint for ``arch`` and return its directory.

    ``overrides`` patch the config (a benchmark case may need e.g. ``attention_bias``); they are part of the
    cache key. Building is atomic: a half-written model is never served from the cache.
    """
    config_dict = recipe(arch)
    config_dict.update(overrides or {})
    key = recipe_hash(arch, overrides)
    target = (root or zoo_dir()) / f"{arch}-{key}"
    if (target / "ekka-zoo.json").exists():
        return target

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{arch}-", dir=target.parent))
    try:
        model_type = config_dict.pop("model_type")
        embed_scale = config_dict.pop("_embed_scale", None)
        config = AutoConfig.for_model(model_type, **config_dict)
        config.dtype = "float32"
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _perturb_norm_weights(model, seed)
        if embed_scale is not None:
            with torch.no_grad():
                model.get_input_embeddings().weight.mul_(embed_scale)
        model.save_pretrained(staging, safe_serialization=True)
        _declare_dtype(staging, CHECKPOINT_DTYPE)
        _train_tokenizer(staging, config_dict)
        _readable_by_transformers_4(staging)
        (staging / "ekka-zoo.json").write_text(json.dumps(
            {"arch": arch, "recipe_hash": key, "seed": seed, "zoo_version": ZOO_VERSION}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _declare_dtype(directory: Path, dtype: str) -> None:
    """Declare the dtype real checkpoints are served in (what ``--dtype auto`` follows); the weights stay fp32, so
    the fp32 reference reads them unrounded."""
    cfg = directory / "config.json"
    config = json.loads(cfg.read_text())
    config["dtype"] = dtype
    cfg.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _readable_by_transformers_4(directory: Path) -> None:
    """Also write the keys transformers 4.x reads (older engine releases run with it: ``ekka bisect``,
    ``--python``): ``torch_dtype`` beside ``dtype``, ``rope_theta`` / ``rope_scaling`` beside ``rope_parameters``
    (4.x ignores the latter and would silently use its default theta), and the tokenizer class both know."""
    cfg = directory / "config.json"
    config = json.loads(cfg.read_text())
    config.setdefault("torch_dtype", config.get("dtype"))
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            config.setdefault("rope_scaling", {"type": rope["rope_type"], **{k: v for k, v in rope.items()
                                                                            if k != "rope_theta"}})
    cfg.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok = directory / "tokenizer_config.json"
    if tok.exists():
        t = json.loads(tok.read_text())
        if t.get("tokenizer_class") == "TokenizersBackend":
            t["tokenizer_class"] = "PreTrainedTokenizerFast"
            tok.write_text(json.dumps(t, indent=2, sort_keys=True) + "\n")


def _perturb_norm_weights(model: Any, seed: int) -> None:
    """Give norm weights and biases random values: HF initialises them to exactly 1 / 0 (0 for Gemma's 1+w
    form), which would hide a norm that ignores its weight or a layer that drops its bias."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ("norm" in name and name.endswith("weight")) or name.endswith(".bias"):
                param.add_(0.1 * torch.randn(param.shape, generator=gen))


def _train_tokenizer(out: Path, config: dict[str, Any]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]  # ids 0..3, matching the config's special ids
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=config["vocab_size"], special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    # Every zoo tokenizer prepends BOS, as Llama and Gemma do: that makes "the harness forgot BOS" testable.
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.model_max_length = config["max_position_embeddings"]
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def tokenizer_without_bos(model_dir: Path | str) -> Path:
    """A copy of ``model_dir``'s tokenizer that does not prepend BOS — what a harness that forgets Gemma's BOS
    feeds the engine (vLLM #28539). Pass it as the target's ``tokenizer`` engine argument."""
    from tokenizers import Tokenizer, processors

    model_dir = Path(model_dir)
    out = model_dir.parent / f"{model_dir.name}-tokenizer-no-bos"
    if (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / name)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out / "tokenizer.json"))
    return out
