"""The analysis stage: the error ratio, the first *sustained* change point, and ranking on hand-made aligned pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ekka_core.analysis import analyse, error_ratio
from ekka_core.analysis.observations import _first_sustained_shift
from ekka_core.contracts.ranking import UNIT_ROUNDOFF
from ekka_core.contracts.alignment import ALIGNMENT_FAILED, AlignmentFailure
from ekka_core.contracts.report import Unchecked
from hand_made import aligned_pairs

LOG_THR = math.log10(2.0)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- error ratio ----------------------------------------------------------------------------------------------

def _noisy(y: torch.Tensor, scale: float, seed: int) -> torch.Tensor:
    return y + scale * torch.randn(y.shape, generator=_g(seed))


def test_ratio_is_about_one_when_target_error_matches_reference_error():
    y = torch.randn(64, 256, generator=_g(0))
    x_r, x_t = _noisy(y, 0.01, 1), _noisy(y, 0.01, 2)     # same scale, independent noise
    r = float(error_ratio(x_t, x_r, y, "bfloat16"))
    assert 0.9 < r < 1.1


def test_ratio_scales_with_target_error():
    y = torch.randn(64, 256, generator=_g(0))
    x_r = _noisy(y, 0.01, 1)
    r = float(error_ratio(_noisy(y, 0.2, 2), x_r, y, "bfloat16"))   # 20x the reference's own error
    assert 18 < r < 22
    assert r > 2.0  # far above any threshold in the paper's stable range (1.5-2.5)


def test_per_token_ratio_localises_the_rows_that_are_off():
    y = torch.randn(16, 256, generator=_g(0))
    x_r = _noisy(y, 0.01, 1)
    x_t = _noisy(y, 0.01, 2)
    x_t[10:] = _noisy(y[10:], 0.3, 3)           # rows 10.. are 30x off
    r = error_ratio(x_t, x_r, y, "bfloat16", dim=1)
    assert r.shape == (16,)
    assert (r[:10] < 1.5).all() and (r[10:] > 20).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_floor_keeps_ratio_finite_when_reference_equals_fp32(dtype):
    y = torch.randn(8, 64, generator=_g(0))
    e = torch.randn(8, 64, generator=_g(1))
    e = e * (0.01 * y.norm() / e.norm())          # ‖X_T − Y_R‖ = 1 % of ‖Y_R‖
    r = float(error_ratio(y + e, y.clone(), y, dtype))
    assert math.isfinite(r)
    # denominator floored at a fraction of the dtype's unit roundoff (relative to ‖Y_R‖), never below 1e-5
    floor_rel = max(0.25 * UNIT_ROUNDOFF[dtype], 1e-5)
    assert r == pytest.approx(0.01 / floor_rel, rel=1e-4)
    # identical everything: zero, not NaN
    assert float(error_ratio(y.clone(), y.clone(), y, dtype)) == 0.0


def test_floor_keeps_ratio_finite_for_an_all_zero_reference():
    z = torch.zeros(4, 8)
    r = float(error_ratio(z + 1e-3, z.clone(), z, "bfloat16"))
    assert math.isfinite(r) and r > 2.0


def test_floor_does_not_mask_a_real_reference_error():
    # When X_R's own error is well above the floor, the floor must not change the ratio.
    y = torch.randn(8, 64, generator=_g(0))
    x_r = _noisy(y, 0.05, 1)
    x_t = _noisy(y, 0.1, 2)
    r = float(error_ratio(x_t, x_r, y, "bfloat16"))
    assert r == pytest.approx(float((x_t - y).norm() / (x_r - y).norm()), rel=1e-6)


# --- first sustained shift ------------------------------------------------------------------------------------

def _noise(n: int, seed: int, sd: float = 0.08) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, sd, n)


@pytest.mark.parametrize("seed", range(5))
def test_flat_noise_has_no_shift(seed):
    log_r = _noise(80, seed)
    log_r[[7, 40]] = LOG_THR + 0.05           # a couple of points just over the threshold: still noise
    assert _first_sustained_shift(log_r, LOG_THR) is None


@pytest.mark.parametrize("k", [5, 20, 37])
def test_step_sustained_to_the_end_returns_its_start_not_the_later_maximum(k):
    n = 60
    log_r = _noise(n, k)
    # A step of ~x10 at k, then growth as the error propagates: the maximum is at the very end.
    log_r[k:] += 1.0 + np.linspace(0.0, 2.0, n - k)
    assert int(np.argmax(log_r)) != k
    assert _first_sustained_shift(log_r, LOG_THR) == k


def test_moderate_step_then_larger_step_returns_the_first():
    log_r = _noise(50, 3)
    log_r[12:] += 0.9          # ×8: the bug
    log_r[30:] += 1.5          # later amplification
    assert _first_sustained_shift(log_r, LOG_THR) == 12


@pytest.mark.parametrize("where", [0, 10, 25])
def test_single_isolated_spike_is_not_a_shift(where):
    log_r = _noise(40, where)
    log_r[where] = 2.5                        # ×300 once, then back to noise
    assert _first_sustained_shift(log_r, LOG_THR) is None


def test_shift_only_at_the_last_element_is_found():
    # A logits bug: everything agrees until the very last module.
    log_r = _noise(40, 11)
    log_r[-1] = 1.8
    assert _first_sustained_shift(log_r, LOG_THR) == len(log_r) - 1


def test_shift_from_the_very_first_element():
    log_r = _noise(30, 4) + 1.2
    assert _first_sustained_shift(log_r, LOG_THR) == 0


def test_empty_series_has_no_shift():
    assert _first_sustained_shift(np.array([]), LOG_THR) is None


# --- analyse end to end on hand-made aligned pairs -------------------------------------------------------------

def test_consistent_run_has_no_suspects():
    aligned, classes = aligned_pairs(None)
    r = analyse(aligned, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    assert r.verdict == "consistent" and r.suspects == [] and r.change_point is None
    assert len(r.pairs) == len(aligned.items)
    assert all(p.error_ratio < 2.0 for p in r.pairs)


def test_divergence_is_blamed_on_the_first_breaking_module_with_its_onset_token():
    bug = "model.layers.2.self_attn.attn"
    aligned, classes = aligned_pairs(bug, bug_from_pos=5)
    r = analyse(aligned, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    assert r.verdict == "divergent"
    names = [p.component for p in r.pairs]
    assert r.change_point == names.index(bug)
    top = r.suspects[0]
    assert top.rank == 1 and top.module == bug and top.cls == "Attention"
    assert top.file == "/src/Attention.py" and top.line == names.index(bug) + 1
    assert top.error_ratio > 2.0
    assert top.onset_token == 5 and top.onset_phase == "prefill"
    assert [s.rank for s in r.suspects] == list(range(1, len(r.suspects) + 1))
    # downstream modules inherit the error; an MLP whose input is already off is not locally to blame
    assert all(s.module != "model.layers.3.mlp" for s in r.suspects)


def test_onset_in_decode_phase_is_named():
    aligned, classes = aligned_pairs("model.layers.1.self_attn.attn", bug_from_pos=9)
    r = analyse(aligned, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8])
    top = r.suspects[0]
    assert top.onset_token == 9 and top.onset_phase == "decode:2"


def test_alignment_failures_are_listed_as_unchecked():
    aligned, classes = aligned_pairs(None)
    why = "model.layers.0.mlp.act_fn ↔ model.layers.0.mlp.act_fn: shapes differ after alignment, target [8, 64] vs reference [8, 32]"
    aligned.failures.append(AlignmentFailure("model.layers.0.mlp.act_fn", why))
    r = analyse(aligned, threshold=2.0, dtype="bfloat16", target_classes=classes, prompt_lens=[8],
                unchecked=[Unchecked("model.layers.0.self_attn.rotary_emb", "unmapped")])
    # the record names the component (not the whole message) and keeps the message as the reason
    assert Unchecked("model.layers.0.mlp.act_fn", f"{ALIGNMENT_FAILED}: {why}") in r.unchecked
    assert all(" " not in u.module for u in r.unchecked)      # module paths, never a message
    assert Unchecked("model.layers.0.self_attn.rotary_emb", "unmapped") in r.unchecked


# --- regression: a target that produces NaN is judged "consistent" -------------------------

def test_nan_target_output_is_divergent():
    aligned, classes = aligned_pairs(None)
    bug = aligned.items[7]                       # model.layers.2.self_attn.attn
    for it in aligned.items[7:]:
        it.target[0, 0] = float("nan")           # e.g. fp16 overflow (inf - inf) from here on
    r = analyse(aligned, threshold=2.0, dtype="float16", target_classes=classes, prompt_lens=[8])
    assert r.verdict == "divergent"
    assert r.suspects[0].module == bug.pair.component
