"""The residual-stream convention of an engine's decoder layers, read from the trace alone: the final norm's output
is an affine function of the normalised stream, so the reconstruction it fits is the stream."""

from __future__ import annotations

import torch

from ekka_core.align.proof import _norm_fit


def _layer_outputs(n: int = 40, h: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    stream = torch.randn(n, h, generator=g, dtype=torch.float64) * 3 + torch.randn(h, generator=g, dtype=torch.float64)
    before_block = stream - torch.randn(n, h, generator=g, dtype=torch.float64)   # the stream before the last block
    return stream, before_block


def test_rms_norm_output_fits_the_stream_not_a_wrong_reconstruction():
    stream, other = _layer_outputs()
    w = torch.linspace(0.5, 1.5, stream.shape[1], dtype=torch.float64)
    normed = w * stream / stream.pow(2).mean(-1, keepdim=True).sqrt()
    assert _norm_fit(stream, normed) < 1e-6
    # vLLM's StableLM returns (stream, stream before the MLP): summing them is not the stream
    assert _norm_fit(stream + other, normed) > 0.05


def test_layer_norm_output_fits_the_stream_and_a_delta_alone_does_not():
    stream, other = _layer_outputs(seed=1)
    w, b = torch.linspace(0.5, 1.5, stream.shape[1], dtype=torch.float64), torch.linspace(-1, 1, stream.shape[1],
                                                                                           dtype=torch.float64)
    centred = stream - stream.mean(-1, keepdim=True)
    normed = w * centred / centred.pow(2).mean(-1, keepdim=True).sqrt() + b
    assert _norm_fit(stream, normed) < 1e-6
    # vLLM's Llama returns (delta, residual): the delta alone is not the stream
    assert _norm_fit(stream - other, normed) > 0.05
