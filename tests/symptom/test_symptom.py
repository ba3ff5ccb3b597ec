"""The symptom check (logits-level error ratio of an untraced run) and MoE routing ties, on hand-made logprobs."""

from __future__ import annotations

import math

import torch

from ekka_core.capture.routing import routing_tie_rows
from ekka_core.contracts.serving import EngineOutputs, RequestOutcome
from ekka_core.symptom import check_symptom

TOKENS = [3, 5, 7, 9]
PROMPT = [1, 2, 3, 4]                          # sampled rows are positions 3, 4, 5


def _reference(shift: float) -> list[dict]:
    """Three sampled steps of fp32-like logprobs, each moved by ``shift`` (a reference's own rounding)."""
    base = [-0.5, -1.5, -2.5, -3.5]
    return [{"tokens": TOKENS, "logprobs": [v + shift * (i + 1) for i, v in enumerate(base)], "argmax": 3}
            for _ in range(3)]


def _run(engine_shift: list[float]) -> tuple[EngineOutputs, dict]:
    """The engine's logprobs moved from fp32 by ``engine_shift[j]`` per step; the bf16 reference by 0.01."""
    fp32, low = _reference(0.0), _reference(0.01)
    logprobs = [{t: v + s * (i + 1) for i, (t, v) in enumerate(zip(TOKENS, step["logprobs"]))}
                for step, s in zip(fp32, engine_shift)]
    outputs = EngineOutputs("vllm", "x", "served", {}, {}, "bfloat16",
                            requests=[RequestOutcome(0, PROMPT, [3, 3, 3], logprobs)])
    return outputs, {"low": {"requests": [{"request": 0, "steps": low}]},
                     "fp32": {"requests": [{"request": 0, "steps": fp32}]}}


def test_an_engine_as_close_to_fp32_as_the_reference_is_consistent():
    outputs, scores = _run([0.01, 0.01, 0.01])
    check = check_symptom(outputs, scores, threshold=2.0)
    assert math.isclose(check.ratio, 1.0, rel_tol=1e-6) and not check.diverges and check.first is None


def test_a_departure_at_one_position_diverges_and_is_named():
    outputs, scores = _run([0.01, 0.01, 0.5])
    check = check_symptom(outputs, scores, threshold=2.0)
    assert check.diverges and check.ratio > 2.0
    assert (check.first.request, check.first.position) == (0, 5) and check.first.ratio > 40


def test_a_routing_tie_position_is_shown_but_left_out_of_the_ratio():
    outputs, scores = _run([0.01, 0.01, 0.5])
    scores["routing_ties"] = {"0": [5]}
    check = check_symptom(outputs, scores, threshold=2.0)
    assert not check.diverges and math.isclose(check.ratio, 1.0, rel_tol=1e-6)
    tied = [p for p in check.positions if p.routing_tie]
    assert [(p.position, p.ratio > 40) for p in tied] == [(5, True)]      # still shown, with its own ratio
    assert "1 of 3 sampled positions left out" in check.note
    # A tie elsewhere does not hide a departure at a position whose routing is clear.
    scores["routing_ties"] = {"0": [3]}
    assert check_symptom(outputs, scores, threshold=2.0).diverges


def test_every_position_tied_counts_them_all():
    outputs, scores = _run([0.5, 0.5, 0.5])
    scores["routing_ties"] = {"0": [3, 4, 5]}
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


def _rerouted(shift: float) -> dict:
    return {"requests": [{"request": 0, "steps": _reference(shift)}]}


def test_the_reference_routed_the_other_way_is_a_second_noise_floor():
    # An engine 3× as far from fp32 as the bf16 reference: a divergence, unless the same reference with its tied
    # tokens routed to their next expert is as far (a correct engine's other rounding may route them so).
    outputs, scores = _run([0.03, 0.03, 0.03])
    scores["routing_ties"] = {"0": [1]}                      # a tied prompt token, before every sampled position
    assert check_symptom(outputs, scores, threshold=2.0).diverges
    scores["low_rerouted"] = _rerouted(0.03)
    check = check_symptom(outputs, scores, threshold=2.0)
    assert not check.diverges and math.isclose(check.ratio, 1.0, rel_tol=1e-6)
    assert check.rerouted_tokens == 1 and "routed to their next expert" in check.note
    # The floor only widens as far as rerouting moves the reference: a larger departure still diverges.
    outputs, _ = _run([0.2, 0.2, 0.2])
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
