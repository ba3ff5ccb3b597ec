"""Building a zoo checkpoint: deterministic random weights from a recipe, saved atomically under the cache
directory named after the recipe's hash."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ekka_core.zoo.recipes import CHECKPOINT_DTYPE, ZOO_VERSION, recipe, recipe_hash
from ekka_core.zoo.tokenizer import _train_tokenizer


def zoo_dir() -> Path:
    return Path(os.environ.get("EKKA_ZOO_DIR", Path.home() / ".cache" / "ekka" / "zoo"))


def build_model(arch: str, *, overrides: dict[str, Any] | None = None, seed: int = 0,
                root: Path | None = None) -> Path:
    """Build (or reuse) the tiny checkpoint for ``arch`` and return its directory.

    ``overrides`` patch the config (a benchmark case may need e.g. ``attention_bias``); they are part of the
    cache key. Building is atomic: a half-written model is never served from the cache.
    """
    config_dict = recipe(arch)
    config_dict.update(overrides or {})
    key = recipe_hash(arch, overrides)
    target = (root or zoo_dir()) / f"{arch.replace(':', '-')}-{key}"
    if (target / "ekka-zoo.json").exists():
        return target

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{arch.replace(':', '-')}-", dir=target.parent))
    try:
        model_type = config_dict.pop("model_type")
        embed_scale = config_dict.pop("_embed_scale", None)
        architectures = config_dict.pop("_architectures", None)
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
        if architectures:
            _declare_architectures(staging, architectures)
        # the sizes as the config resolved them (a generated recipe may name them n_embd, n_positions, …)
        _train_tokenizer(staging, {"vocab_size": config.vocab_size,
                                   "max_position_embeddings": getattr(config, "max_position_embeddings", None)
                                   or config_dict.get("max_position_embeddings", 512)})
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


def _declare_architectures(directory: Path, architectures: list[str]) -> None:
    """Name the class vLLM registers where its spelling differs from HF's (``PhiMoEForCausalLM`` for HF's
    ``PhimoeForCausalLM``, as the real checkpoints do): HF picks its class by ``model_type``, vLLM by this."""
    cfg = directory / "config.json"
    config = json.loads(cfg.read_text())
    config["architectures"] = list(architectures)
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
