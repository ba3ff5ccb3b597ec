"""MoE routing ties: tokens whose top-k expert choice is decided by less than the reference's own rounding noise.

Given one router call's logits ``[tokens, experts]`` in fp32 (Y) and in the reference's low precision (X), the
margin between the k-th and (k+1)-th logit in fp32 against how far X's logits moved from Y's: two logits that each
move by that much can swap order only if their margin is below twice the movement. Such a token may be routed to
other experts by any correct engine whose rounding differs (a compiled graph, a fused kernel) — a discrete jump that
is not a bug. Used by alignment (module pairs exclude those rows after the router) and by the symptom check (sampled
positions whose token is tied are left out of the logits-level ratio).
"""

from __future__ import annotations

import torch


def routing_tie_rows(fp32_logits: torch.Tensor, low_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """(tied rows mask, margin, noise) for one router call; rows are tokens."""
    y = fp32_logits.float().reshape(-1, fp32_logits.shape[-1])
    x = low_logits.float().reshape(-1, fp32_logits.shape[-1])
    if y.shape[-1] <= k:
        none = torch.zeros(y.shape[0], dtype=torch.bool)
        return none, torch.full((y.shape[0],), float("inf")), torch.zeros(y.shape[0])
    top = y.topk(k + 1, dim=-1).values
    margin = top[:, k - 1] - top[:, k]
    noise = (x - y).abs().amax(dim=-1)
    return margin < 2 * noise, margin, noise


def traced_router_ties(reference, reference_fp32):
    """Per MoE router call of a teacher-forced reference (an HF module named ``gate`` returning logits ``[tokens,
    experts]`` and the chosen expert ids ``[tokens, k]``), traced in low precision and in fp32: ``(fp32 call, tied
    rows mask, margin, noise)``. Shared by alignment (per-module exclusions) and the traced symptom check."""
    from ekka_core.capture.trace import TensorRef

    for call in reference_fp32.calls:
        if call.module.rsplit(".", 1)[-1] != "gate":
            continue
        outs = [o for o in call.outputs if isinstance(o, TensorRef)]
        ids = next((o for o in outs if not o.is_float and len(o.shape) >= 2), None)
        logits = next((o for o in outs if o.is_float and len(o.shape) >= 2 and ids is not None
                       and o.shape[-1] > ids.shape[-1]), None)
        twin = next((c for c in reference.calls_of(call.module) if c.step == call.step), None)
        if ids is None or logits is None or twin is None:
            continue
        low = next((o for o in twin.outputs if isinstance(o, TensorRef) and o.shape == logits.shape), None)
        if low is None:
            continue
        yield (call, *routing_tie_rows(reference_fp32.tensor(logits), reference.tensor(low), ids.shape[-1]))
