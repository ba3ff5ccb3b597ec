"""The non-finite check on hand-made aligned pairs: the first module whose output holds NaN/Inf where the fp32
reference is finite is found, with its rows; non-finite values the reference shares are not a finding."""

from __future__ import annotations

import pytest
import torch

from ekka_core.analysis import analyse
from ekka_core.checks import Evidence, compose, run_check
from ekka_core.checks import non_finite as non_finite_module
from ekka_core.checks.modules import ModuleCheck
from ekka_core.checks.non_finite import NonFiniteCheck
from hand_made import SPEC, FakeAligned, aligned_pairs


@pytest.fixture
def nan_from_layer2(monkeypatch):
    pairs, classes = aligned_pairs(None)
    for it in pairs.items[7:]:                    # model.layers.2.self_attn.attn and everything after it
        it.target[3, 5] = float("inf")
        it.target[4, 0] = float("nan")
    by_name = {it.pair.component: it for it in pairs.items}
    # re-reading a pair's tensors: the hand-made pair itself (align_pair needs real traces)
    monkeypatch.setattr(non_finite_module, "align_pair", lambda pair, traces, order=-1: by_name[pair.component])
    ranking = analyse(pairs, threshold=2.0, dtype="float16", target_classes=classes, prompt_lens=[8])
    return ranking, FakeAligned(pairs)


def test_the_first_module_outputting_nan_where_the_reference_is_finite_is_found(nan_from_layer2):
    ranking, aligned = nan_from_layer2
    out = NonFiniteCheck().run(Evidence(SPEC, ranking=ranking, aligned=aligned))
    assert out.status == "diverges"
    (s,) = out.findings
    assert s.module == "model.layers.2.self_attn.attn" and s.kind == "non-finite"
    assert s.non_finite == 2 and [(r.request, r.position) for r in s.rows] == [(0, 3), (0, 4)]
    assert s.onset_token == 3 and s.file == "/src/attn.py"
    ev = Evidence(SPEC, ranking=ranking, outcomes=[run_check(ModuleCheck(), Evidence(SPEC, ranking=ranking)), out])
    assert compose(ev).suspects[0].kind == "non-finite"


def test_non_finite_values_the_reference_shares_are_not_a_finding(nan_from_layer2):
    ranking, aligned = nan_from_layer2
    for it in aligned.items:
        it.reference_fp32[~torch.isfinite(it.target)] = float("nan")
    assert NonFiniteCheck().run(Evidence(SPEC, ranking=ranking, aligned=aligned)).status == "agrees"


def test_a_clean_run_has_no_non_finite_finding():
    pairs, classes = aligned_pairs(None)
    ranking = analyse(pairs, threshold=2.0, dtype="float16", target_classes=classes, prompt_lens=[8])
    out = NonFiniteCheck().run(Evidence(SPEC, ranking=ranking, aligned=FakeAligned(pairs)))
    assert out.status == "agrees" and out.findings == []
