"""Bug case ``falcon-parallel-mlp-own-layernorm``: Falcon's parallel MLP normalised by a LayerNorm of its own."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _parallel_mlp_own_layernorm() -> None:
    """NVIDIA/TransformerEngine #625: with ``parallel_attn`` and not ``new_decoder_architecture`` (Falcon-7B),
    attention and MLP share one input LayerNorm; TransformerEngine's Falcon layer always gave the MLP a LayerNorm of
    its own (fresh weights: 1 and 0). Re-injected into vLLM's Falcon: its MLP sees the stream normalised without the
    checkpoint's LayerNorm weight and bias."""
    falcon = vllm_compat().model_module("falcon")
    layer_forward = falcon.FalconDecoderLayer.forward
    mlp_forward = falcon.FalconMLP.forward

    def forward(self: Any, positions: Any, hidden_states: Any) -> Any:
        self.mlp._ekka_shared_norm = self.input_layernorm
        return layer_forward(self, positions, hidden_states)

    def mlp(self: Any, x: Any) -> Any:
        norm = getattr(self, "_ekka_shared_norm", None)
        if norm is not None:   # undo the shared LayerNorm's affine part: a fresh LayerNorm's output
            x = (x - norm.bias) / norm.weight
        return mlp_forward(self, x)

    falcon.FalconDecoderLayer.forward = forward
    falcon.FalconMLP.forward = mlp


BUG = Bug("falcon-parallel-mlp-own-layernorm", "sweep:falcon",
          "Falcon (parallel attention): the MLP normalised by its own LayerNorm, not the shared one",
          "https://github.com/NVIDIA/TransformerEngine/issues/625 (pattern; injected into vLLM's Falcon)",
          r"^transformer\.h\.0(\.mlp)?$", _parallel_mlp_own_layernorm)
