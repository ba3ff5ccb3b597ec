"""Fixtures of the mapping agent's tests: the fake Anthropic API, the toy model's source file, synthetic traces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_toy import DENSE, FANCY, FUSED, TOY_SOURCE, write_trace
from ekka_core.align import Traces
from ekka_core.capture.trace import Step
from fake_anthropic import FakeAnthropic


@pytest.fixture
def api():
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def toy_src(tmp_path) -> Path:
    p = tmp_path / "toy_model.py"
    p.write_text(TOY_SOURCE)
    return p


@pytest.fixture
def traces(tmp_path, toy_src) -> Traces:
    g = torch.Generator().manual_seed(0)
    n = 6
    H, X, A, B, S = (torch.randn(n, w, generator=g) for w in (8, 8, 4, 6, 8))
    t_steps = [Step(0, "prefill", [0] * 5, list(range(5))), Step(1, "decode:1", [0], [5])]
    t_calls = []
    for step, rows in ((0, slice(0, 5)), (1, slice(5, 6))):
        t_calls += [(step, "model.layers.0.mlp.fancy_proj", "WeirdLinear", [X[rows]], [H[rows]]),
                    (step, "model.layers.0.mlp.fused", "FusedUp", [torch.cat([B, A], 1)[rows]], [H[rows]]),
                    (step, "model.layers.0.mlp.scaled", "ScaledThing", [2 * S[rows]], [H[rows]]),
                    (step, "", "EkkaToyForCausalLM", [X[rows]], [])]
    r_steps = [Step(0, "teacher-forced", [0] * n, list(range(n)))]
    r_calls = [(0, "model.layers.0.mlp.dense_h_to_4h", "Linear", [X[None]], [H[None]]),
               (0, "model.layers.0.mlp.a_proj", "Linear", [A[None]], [H[None]]),
               (0, "model.layers.0.mlp.b_proj", "Linear", [B[None]], [H[None]]),
               (0, "model.layers.0.mlp.scaled_ref", "Linear", [S[None]], [H[None]]),
               (0, "", "EkkaToyForCausalLM", [X[None]], [])]
    target = write_trace(tmp_path / "t", "vllm", "target", t_steps, t_calls, toy_src)
    reference = write_trace(tmp_path / "r", "hf", "reference", r_steps, r_calls, toy_src)
    return Traces(target, reference, reference)


@pytest.fixture
def batch_traces(tmp_path, toy_src) -> Traces:
    """Two sequences (4 and 3 tokens) in one engine batch: a prefill step holding both prompts, then a decode step
    holding both; the reference runs each sequence as its own [1, L, …] pass."""
    g = torch.Generator().manual_seed(1)
    lens = [4, 3]
    A = [torch.randn(n, 4, generator=g) for n in lens]
    B = [torch.randn(n, 6, generator=g) for n in lens]
    X = [torch.randn(n, 8, generator=g) for n in lens]
    t_steps = [Step(0, "prefill", [0, 0, 0, 1, 1], [0, 1, 2, 0, 1]), Step(1, "decode:1", [0, 1], [3, 2])]
    t_calls = []
    for step in t_steps:
        def rows(per_seq):
            return torch.stack([per_seq[s][p] for s, p in zip(step.seq, step.pos)])
        t_calls += [(step.index, FANCY, "WeirdLinear", [rows(X)], [rows(X)]),
                    (step.index, FUSED, "FusedUp", [torch.cat([rows(B), rows(A)], 1)], [rows(X)])]
    r_steps = [Step(s, "teacher-forced", [s] * n, list(range(n))) for s, n in enumerate(lens)]
    r_calls = []
    for s in range(2):
        r_calls += [(s, DENSE, "Linear", [X[s][None]], [X[s][None]]),
                    (s, "model.layers.0.mlp.a_proj", "Linear", [A[s][None]], [X[s][None]]),
                    (s, "model.layers.0.mlp.b_proj", "Linear", [B[s][None]], [X[s][None]])]
    ids = dict(token_ids=[[1, 2, 3, 4], [5, 6, 7]], prompt_lens=[3, 2])
    target = write_trace(tmp_path / "bt", "vllm", "target", t_steps, t_calls, toy_src, **ids)
    reference = write_trace(tmp_path / "br", "hf", "reference", r_steps, r_calls, toy_src, **ids)
    return Traces(target, reference, reference)
