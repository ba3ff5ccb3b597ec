"""The zoo tokenizer: a small BPE trained on the recipes' corpus (prepends BOS, as Llama and Gemma do), and a
copy of it that forgets BOS."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ekka_core.zoo.recipes import CHAT_TEMPLATE, _CORPUS


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
