"""Bug case ``inductor-silu-decomposition-wrong``: Inductor decomposes SiLU wrongly, so only the compiled default
computes the MLP's activation wrong."""

from __future__ import annotations

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import DEFAULT_PROMPTS


def _silu_decomposed_with_quick_gelu_scale() -> None:
    """The class of PyTorch #168126 / fix #177163 (an Inductor decomposition that does not compute what the eager op
    does — there ``native_layer_norm``'s rounding in bf16 — so torch.compile'd models drift from eager): a wrong
    decomposition of one op, seen only where Inductor compiles it. Injected: ``aten.silu`` decomposes to quick-GELU's
    ``x · sigmoid(1.702 x)``. Eager vLLM never reaches it (no eager path decomposes anything): the case is clean
    under ``enforce_eager``, proven by its own traced baseline."""
    import torch
    import torch._inductor.decomposition as decomposition

    decomposition.decompositions[torch.ops.aten.silu.default] = lambda x: x * torch.sigmoid(1.702 * x)
    decomposition.fast_random_decomps.cache_clear()      # Inductor caches the merged table


BUG = Bug("inductor-silu-decomposition-wrong", "llama",
          "Inductor decomposes SiLU wrongly (quick-GELU's sigmoid scale): only the compiled default's MLP is wrong",
          "https://github.com/pytorch/pytorch/issues/168126 (fix https://github.com/pytorch/pytorch/pull/177163; "
          "analogue: a wrong Inductor decomposition of one op, here aten.silu)",
          r"^model\.layers\.0\.mlp(\.act_fn)?$", _silu_decomposed_with_quick_gelu_scale,
          requests=[{"id": "a", "prompt": DEFAULT_PROMPTS[0]}], max_new_tokens=8,
          expected_culprit=["compilation"], expected_rank=3, expected_kind="compiled",
          expected_words=r"silu at [^;]*activation\.py:\d+.*compiler stage: decomposition aten\.silu\.default")
