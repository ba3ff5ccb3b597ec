"""The symptom check (logits-level error ratio of an untraced run) and MoE routing ties, on hand-made logprobs."""

from __future__ import annotations

import math

import torch

from ekka_core.capture.routing import routing_tie_rows
from ekka_core.symptom import check_symptom
from hand_made import TOKENS, scored_reference, symptom_run

def test_an_engine_as_close_to_fp32_as_the_reference_is_consistent():
    outputs, scores = symptom_run([0.01, 0.01, 0.01])
    check = check_symptom(outputs, scores, threshold=2.0)
    assert math.isclose(check.ratio, 1.0, rel_tol=1e-6) and not check.diverges and check.first is None


def test_a_departure_at_one_position_diverges_and_is_named():
    outputs, scores = symptom_run([0.01, 0.01, 0.5])
    check = check_symptom(outputs, scores, threshold=2.0)
    assert check.diverges and check.ratio > 2.0
    assert (check.first.request, check.first.position) == (0, 5) and check.first.ratio > 40


def test_a_routing_tie_position_is_shown_but_left_out_of_the_ratio():
    outputs, scores = symptom_run([0.01, 0.01, 0.5])
    scores.routing_ties = {0: [5]}
    check = check_symptom(outputs, scores, threshold=2.0)
    assert not check.diverges and math.isclose(check.ratio, 1.0, rel_tol=1e-6)
    tied = [p for p in check.positions if p.routing_tie]
    assert [(p.position, p.ratio > 40) for p in tied] == [(5, True)]      # still shown, with its own ratio
    assert "1 of 3 sampled positions left out" in check.note
    # A tie elsewhere does not hide a departure at a position whose routing is clear.
    scores.routing_ties = {0: [3]}
    assert check_symptom(outputs, scores, threshold=2.0).diverges


def test_every_position_tied_counts_them_all():
    outputs, scores = symptom_run([0.5, 0.5, 0.5])
    scores.routing_ties = {0: [3, 4, 5]}
    check = check_symptom(outputs, scores, threshold=2.0)
    assert check.diverges and "all 3 are counted" in check.note


def test_routing_tie_rows_compares_the_topk_margin_with_the_reference_rounding():
    # experts' fp32 logits; top-2 of [2.0, 1.0, 0.99, -1]: the 2nd/3rd margin is 0.01
    y = torch.tensor([[2.0, 1.0, 0.99, -1.0], [2.0, 1.0, 0.0, -1.0]])
    x = y + torch.tensor([[0.0, -0.01, 0.01, 0.0], [0.0, -0.01, 0.01, 0.0]])   # bf16 moved each logit by ≤ 0.01
    tied, margin, noise = routing_tie_rows(y, x, k=2)
    assert tied.tolist() == [True, False]
    assert torch.allclose(margin, torch.tensor([0.01, 1.0])) and torch.allclose(noise, torch.tensor([0.01, 0.01]))
    assert not routing_tie_rows(y, x, k=4)[0].any()                 # k ≥ experts: nothing to tie


def test_the_reference_routed_the_other_way_is_a_second_noise_floor():
    # An engine 3× as far from fp32 as the bf16 reference: a divergence, unless the same reference with its tied
    # tokens routed to their next expert is as far (a correct engine's other rounding may route them so).
    outputs, scores = symptom_run([0.03, 0.03, 0.03])
    scores.routing_ties = {0: [1]}                           # a tied prompt token, before every sampled position
    assert check_symptom(outputs, scores, threshold=2.0).diverges
    scores.low_rerouted = scored_reference(0.03)
    check = check_symptom(outputs, scores, threshold=2.0)
    assert not check.diverges and math.isclose(check.ratio, 1.0, rel_tol=1e-6)
    assert check.rerouted_tokens == 1 and "routed to their next expert" in check.note
    # The floor only widens as far as rerouting moves the reference: a larger departure still diverges.
    outputs, _ = symptom_run([0.2, 0.2, 0.2])
    check = check_symptom(outputs, scores, threshold=2.0)
    assert check.diverges and math.isclose(check.ratio, 0.2 / 0.03, rel_tol=1e-6)


def test_route_ties_elsewhere_swaps_the_kth_expert_for_the_next_on_tied_rows_only():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    from ekka_core.capture.hf_runner import _route_ties_elsewhere

    router = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=4, num_experts=4, num_experts_per_tok=2))
    with torch.no_grad():
        router.weight.copy_(torch.eye(4))                      # logits = the hidden state itself
    hidden = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    out = router(hidden)
    assert out[2].tolist() == [[0, 1], [3, 2]]
    moved = _route_ties_elsewhere(out, torch.tensor([True, False]))
    assert moved[2].tolist() == [[0, 2], [3, 2]]               # row 0: 2nd choice (1) → 3rd (2); row 1 untouched
    assert moved[0] is out[0] and moved[1] is out[1]           # logits and weights kept
    assert _route_ties_elsewhere(out, torch.tensor([False, False])) is None


def test_a_nan_logprob_is_a_divergence_never_a_ratio():
    outputs, scores = symptom_run([0.01, 0.01, 0.01])
    outputs.requests[0].logprobs[1][TOKENS[2]] = float("nan")
    check = check_symptom(outputs, scores, threshold=2.0)
    assert check.diverges and check.non_finite == 1
    assert (check.first.request, check.first.position) == (0, 4)
    assert "NaN/Inf at 1 sampled position" in check.note and "NaN/Inf logprobs" in check.words()


def test_an_inf_logprob_diverges_too_and_a_nan_threshold_cannot_hide_it():
    outputs, scores = symptom_run([0.01, 0.01, 0.01])
    outputs.requests[0].logprobs[0][TOKENS[0]] = float("inf")
    assert check_symptom(outputs, scores, threshold=float("nan")).diverges


def test_no_logprobs_compare_nothing_and_say_so():
    outputs, scores = symptom_run([0.01, 0.01, 0.01])
    outputs.requests[0].logprobs = []
    check = check_symptom(outputs, scores, threshold=2.0)
    assert check.positions == [] and not check.diverges
    assert "no logprobs" in check.note        # the output check makes this inconclusive (tests/checks)
