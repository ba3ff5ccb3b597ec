"""The reference run (HF, ``hf_runner.run``): one set of weight fingerprints for its two precisions."""

from __future__ import annotations

import torch

from ekka_core.capture import hf_runner
from ekka_core.capture.trace import Trace
from ekka_core.contracts.spec import DiagnosisSpec


def test_the_low_precision_run_takes_the_fp32_runs_weight_sums_which_are_its_own(zoo_model, tmp_path, monkeypatch):
    from ekka_core.capture import hooks

    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=["a b c"])
    ids, lens = [[1, 5, 9, 14, 3]], [3]
    fp32 = hf_runner.run(spec, ids, lens, "float32", "reference-fp32", tmp_path / "fp32")
    summed = []
    real = hooks.weight_sums
    monkeypatch.setattr(hooks, "weight_sums", lambda params: summed.append(1) or real(params))
    hf_runner.run(spec, ids, lens, "bfloat16", "reference", tmp_path / "shared", weight_sums=fp32["weight_sums"])
    assert not summed                                   # not computed again
    own = hf_runner.run(spec, ids, lens, "bfloat16", "reference", tmp_path / "own")
    assert own["weight_sums"] and set(own["weight_sums"]) == set(fp32["weight_sums"])
    # bf16-rounded before summing: the fp32 load's sums are exactly what the bf16 load computes itself
    assert own["weight_sums"] == fp32["weight_sums"] == Trace(tmp_path / "shared").run.weight_sums
    assert summed                                       # (the counter counts)
    for a, b in zip(Trace(tmp_path / "shared").calls, Trace(tmp_path / "own").calls):
        assert a.module == b.module
    # and the traces themselves do not depend on where the sums came from
    low_a, low_b = Trace(tmp_path / "shared"), Trace(tmp_path / "own")
    last = low_a.calls[-1]
    assert torch.equal(low_a.tensor(last.outputs[0]), low_b.tensor(low_b.calls[-1].outputs[0]))

