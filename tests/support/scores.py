"""Comparing reference scores read off traces with those of a score run."""

from __future__ import annotations

import torch

from ekka_core.contracts.scores import ScoredRun


def fp32_within_the_noise(got: ScoredRun, want: ScoredRun, low: ScoredRun) -> bool:
    """``got``'s fp32 logprobs are ``want``'s to 1% of the low-precision reference's distance from them at each step:
    the fp32 trace stores its tensors as bf16-rounded differences from the low-precision one (2^-9 of that distance),
    and that distance is the noise the symptom check measures an engine against."""
    for rg, rw, rl in zip(got.requests, want.requests, low.requests, strict=True):
        for sg, sw, sl in zip(rg.steps, rw.steps, rl.steps, strict=True):
            if sg.tokens != sw.tokens or sg.argmax != sw.argmax:
                return False
            g, w, lo = (torch.tensor(s.logprobs, dtype=torch.float64) for s in (sg, sw, sl))
            if (g - w).norm() > 1e-2 * (lo - w).norm() + 1e-6:
                return False
    return True
