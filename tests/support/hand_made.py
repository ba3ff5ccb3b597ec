"""Hand-made evidence the checks, analysis and symptom tests share: aligned pairs of a toy model with a bug where
asked, the AlignedPairs surface the checks read, a symptom run's logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ekka_core.contracts.alignment import ALIGNMENT_FAILED
from ekka_core.contracts.report import Report, Unchecked
from ekka_core.contracts.scores import ReferenceScores, ScoredRequest, ScoredRun, ScoredStep
from ekka_core.contracts.serving import EngineOutputs, RequestOutcome
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.mapping import ComponentPair, Endpoint

SPEC = DiagnosisSpec(model="/nowhere", prompts=["x"])


def alignment_failures(report: Report) -> list[Unchecked]:
    """The mapped pairs a diagnosis could not compare because alignment failed (the zoo tests demand none)."""
    return [u for u in report.unchecked if u.reason.startswith(ALIGNMENT_FAILED)]


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _noisy(y: torch.Tensor, scale: float, seed: int) -> torch.Tensor:
    return y + scale * torch.randn(y.shape, generator=_g(seed))


# -- aligned pairs ---------------------------------------------------------------------------------------------
@dataclass
class HandAligned:
    pair: ComponentPair
    order: int
    keys: list
    target: torch.Tensor
    reference: torch.Tensor
    reference_fp32: torch.Tensor
    inputs: tuple | None = None


@dataclass
class HandPairs:
    items: list
    failures: list = field(default_factory=list)
    tied_out: list = field(default_factory=list)     # as align.AlignedPairs: components left with no rows

    def __iter__(self):
        return iter(self.items)


def aligned_pairs(bug_at: str | None, bug_from_pos: int = 0, n_layers: int = 4, n_pos: int = 12) -> tuple[HandPairs, dict]:
    """Execution order: embed, then per layer attn, mlp, layer; then logits. A bug multiplies the target's error
    by 30 from the buggy component on (and on every later component: errors propagate), at positions ≥
    bug_from_pos."""
    names = ["model.embed_tokens"]
    for i in range(n_layers):
        names += [f"model.layers.{i}.self_attn.attn", f"model.layers.{i}.mlp", f"model.layers.{i}"]
    names.append("logits_processor")
    keys = [(0, p) for p in range(n_pos)]
    items, classes = [], {}
    broken = False
    prev_err = 1.0
    for order, name in enumerate(names):
        y = torch.randn(n_pos, 64, generator=_g(order))
        x_r = _noisy(y, 0.01, 1000 + order)
        x_t = _noisy(y, 0.01, 2000 + order)
        broken = broken or name == bug_at
        err = 30.0 if broken else 1.0
        if broken:
            x_t[bug_from_pos:] = _noisy(y[bug_from_pos:], 0.01 * err, 3000 + order)
        inputs = None
        if name.endswith(".mlp"):   # comparable inputs for MLPs: input error = previous component's error
            yi = torch.randn(n_pos, 64, generator=_g(500 + order))
            xi_t = _noisy(yi, 0.01, 4000 + order)
            xi_t[bug_from_pos:] = _noisy(yi[bug_from_pos:], 0.01 * prev_err, 5000 + order)
            inputs = (xi_t, _noisy(yi, 0.01, 6000 + order), yi)
        prev_err = err
        pair = ComponentPair(name, "1:1", "same-path", Endpoint([name]), Endpoint([name]))
        items.append(HandAligned(pair, order, keys, x_t, x_r, y, inputs))
        cls = "Attention" if name.endswith("attn") else "X"
        classes[name] = {"cls": cls, "file": f"/src/{cls}.py", "line": order + 1, "forward_file": None,
                         "forward_line": None}
    return HandPairs(items), classes



class FakeRun:
    module_classes = {"model.layers.2.self_attn.attn": ("Attention", "Attention", "/src/attn.py", 10,
                                                        "/src/attn.py", 20)}


class FakeAligned:
    """What the check reads of AlignedPairs: the mapping's pairs, the traces, the order."""

    def __init__(self, pairs):
        self.items = pairs.items
        self.mapping = type("M", (), {"pairs": [it.pair for it in pairs.items]})()
        self.traces = type("T", (), {"target": type("Tr", (), {"run": FakeRun()})()})()
        self.order = {it.pair.component: it.order for it in pairs.items}


# -- a symptom run ---------------------------------------------------------------------------------------------
TOKENS = [3, 5, 7, 9]
PROMPT = [1, 2, 3, 4]                          # sampled rows are positions 3, 4, 5


def scored_reference(shift: float, dtype: str = "bfloat16") -> ScoredRun:
    """Three sampled steps of fp32-like logprobs, each moved by ``shift`` (a reference's own rounding)."""
    base = [-0.5, -1.5, -2.5, -3.5]
    steps = [ScoredStep(TOKENS, [v + shift * (i + 1) for i, v in enumerate(base)], argmax=3) for _ in range(3)]
    return ScoredRun(dtype, [ScoredRequest(0, steps)])


def symptom_run(engine_shift: list[float]) -> tuple[EngineOutputs, ReferenceScores]:
    """The engine's logprobs moved from fp32 by ``engine_shift[j]`` per step; the bf16 reference by 0.01."""
    fp32, low = scored_reference(0.0, "float32"), scored_reference(0.01)
    logprobs = [{t: v + s * (i + 1) for i, (t, v) in enumerate(zip(TOKENS, step.logprobs))}
                for step, s in zip(fp32.requests[0].steps, engine_shift)]
    outputs = EngineOutputs("vllm", "x", "served", {}, {}, "bfloat16",
                            requests=[RequestOutcome(0, PROMPT, [3, 3, 3], logprobs)])
    return outputs, ReferenceScores(low=low, fp32=fp32)
