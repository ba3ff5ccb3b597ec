"""Bug case ``qwen2-yarn-ignored``: Qwen2: rope_scaling (YaRN) silently ignored."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import _wrap_get_rope


def _qwen2_yarn_ignored() -> None:
    """vLLM #4824 / fix #4930: Qwen2Attention dropped rope_scaling (YaRN), so plain RoPE was used."""
    def plain(params: Any) -> Any:
        return {"rope_type": "default", "rope_theta": (params or {}).get("rope_theta", 10000.0)}
    _wrap_get_rope("vllm.model_executor.models.qwen2", rope_parameters=plain)


BUG = Bug("qwen2-yarn-ignored", "qwen2", "Qwen2: rope_scaling (YaRN) silently ignored",
          "https://github.com/vllm-project/vllm/issues/4824 (fix https://github.com/vllm-project/vllm/pull/4930)",
          r"^model\.layers\.0\.self_attn\.rotary_emb$", _qwen2_yarn_ignored,
          zoo_overrides={"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                             "original_max_position_embeddings": 128}})
