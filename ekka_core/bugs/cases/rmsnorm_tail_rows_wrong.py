"""Bug case ``rmsnorm-tail-rows-wrong``: RMSNorm's remainder path (the rows past the last multiple of 16 of a call)
normalises with a slightly wrong formula."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import CHUNKED_PROMPT
from ekka_core.bugs.vllm_access import _vllm

BLOCK = 16          # rows per full block of the (emulated) vectorised kernel
PAD = 20            # the remainder path takes the mean of squares over hidden + PAD elements


def _rmsnorm_tail_rows() -> None:
    """The class of token-tail kernel bugs — a kernel whose path depends on the number of tokens of a call (vLLM
    #48271: RMSNorm's block size depends on num_tokens) with a wrong remainder path (mirage #415, "Fix tail dealing
    in norm_linear"; TileKernels #26, the last partial tile mishandled) — emulated in vLLM's RMSNorm (every RMSNorm
    of the model: the kernel is shared): in a call of at least one full block of 16 tokens, the rows past the last
    multiple of 16 are normalised with the mean of squares over ``hidden + PAD`` elements (a padded length), i.e.
    scaled up by √((hidden + PAD) / hidden) ≈ 1.038. A call whose token count is a multiple of 16, or smaller
    than 16 (every decode step), is right: only prompts of some lengths, only their last rows."""
    import torch

    rms = _vllm("vllm.model_executor.layers.layernorm", "RMSNorm")
    original = rms.forward_native

    def forward_native(self: Any, x: Any, residual: Any = None) -> Any:
        out = original(self, x, residual)
        normed = out[0] if isinstance(out, tuple) else out
        n = normed.shape[0]
        rows = torch.arange(n, device=normed.device)
        # branch-free, so that the compiled graph (traced once for every token count) keeps it
        tail = ((rows >= (n // BLOCK) * BLOCK) & (rows >= BLOCK)).reshape(-1, *([1] * (normed.dim() - 1)))
        hidden = normed.shape[-1]
        wrong = (normed.float() * ((hidden + PAD) / hidden) ** 0.5).to(normed.dtype)
        normed = torch.where(tail, wrong, normed)
        return (normed, out[1]) if isinstance(out, tuple) else normed

    rms.forward_native = forward_native


# 210 prompt tokens: one prefill call of 13 full blocks of 16 and 2 remainder rows (208, 209); 24 new tokens (decode
# steps of one token are right).
BUG = Bug("rmsnorm-tail-rows-wrong", "llama",
          "RMSNorm's remainder path (rows past the last multiple of 16 of a call) normalises with a slightly wrong "
          "formula",
          "https://github.com/vllm-project/vllm/issues/48271 (RMSNorm's path depends on num_tokens) and the class of "
          "https://github.com/mirage-project/mirage/pull/415 and https://github.com/deepseek-ai/TileKernels/issues/26 "
          "(a kernel's remainder tile wrong) — emulated in vLLM's RMSNorm",
          r"^model\.layers\.0\.input_layernorm$", _rmsnorm_tail_rows,
          requests=[{"id": "a", "prompt": CHUNKED_PROMPT}], max_new_tokens=24, expected_rank=3, expected_kind="rows")
