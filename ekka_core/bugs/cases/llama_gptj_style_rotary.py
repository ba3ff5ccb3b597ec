"""Bug case ``llama-gptj-style-rotary``: Rotary embedding applied in the wrong pairing style."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import _wrap_get_rope


def _gptj_style_rotary() -> None:
    """vLLM #747 / fix #941: rotary applied in the wrong pairing style (NeoX half-split vs GPT-J interleaved)."""
    _wrap_get_rope("vllm.model_executor.models.llama", is_neox_style=False)


BUG = Bug("llama-gptj-style-rotary", "llama", "Rotary embedding applied in the wrong pairing style",
          "https://github.com/vllm-project/vllm/issues/747 (fix https://github.com/vllm-project/vllm/pull/941)",
          r"^model\.layers\.0\.self_attn\.rotary_emb$", _gptj_style_rotary)
