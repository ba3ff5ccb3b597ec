"""Tiny model zoo: deterministic random-weight HF checkpoints with a locally trained tokenizer.

Every architecture Ekka supports has a recipe here. Tests, benchmarks and the demo build models from these
recipes instead of downloading anything. A model is cached on disk under a directory named after the hash of its
recipe, so changing a recipe (or ``ZOO_VERSION``) rebuilds it and never serves a stale checkpoint.

    >>> from ekka_core.zoo import build_model
    >>> path = build_model("gemma3_text")       # ~/.cache/ekka/zoo/gemma3_text-<hash>/

Modules: :mod:`~ekka_core.zoo.recipes` (configs, corpus, cache key), :mod:`~ekka_core.zoo.build` (checkpoints),
:mod:`~ekka_core.zoo.tokenizer` (the tokenizer, and one without BOS).
"""

from ekka_core.zoo.build import build_model, zoo_dir
from ekka_core.zoo.recipes import (CHAT_TEMPLATE, CHECKPOINT_DTYPE, GEMMA_EMBED_SCALE, RECIPES, SLIDING_WINDOW,
                                   ZOO_VERSION, known_architectures, recipe, recipe_hash)
from ekka_core.zoo.tokenizer import tokenizer_without_bos

__all__ = ["CHAT_TEMPLATE", "CHECKPOINT_DTYPE", "GEMMA_EMBED_SCALE", "RECIPES", "SLIDING_WINDOW", "ZOO_VERSION",
           "build_model", "known_architectures", "recipe", "recipe_hash", "tokenizer_without_bos", "zoo_dir"]
