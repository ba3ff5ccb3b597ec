"""In-graph localisation inside a real vLLM-CPU engine in its served (compiled) configuration: the graph vLLM hands
Inductor is captured through Ekka's plugin (``EKKA_GRAPH_DIR``) and localised on the values of the engine's first
real step. What vLLM-CPU's graph allows is reported as it is: its linear layers call oneDNN kernels with prepacked
bf16 weights, which the fp32 twin cannot widen, so those pieces are *not compared* — and the outcome is then never
conclusive, while the pieces around them (norms, activations, attention) are scored."""

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
    modules = [p.module for p in result.pieces]
    layers = json.loads((zoo_model("llama") / "config.json").read_text())["num_hidden_layers"]
    for name in ["embed_tokens", *(f"layers.{i}" for i in range(layers)), "norm"]:
        assert name in modules, modules
    scored = [p for p in result.pieces if p.not_compared is None and p.error_ratio is not None]
    assert any(p.module == "norm" for p in scored) and any(p.module.endswith("act_fn") for p in scored), modules
    assert any(p.module.endswith("input_layernorm") for p in scored), modules
    assert all(p.error_ratio <= result.threshold for p in scored), [(p.module, p.error_ratio) for p in scored]
    unscored = [p for p in result.pieces if p.not_compared is not None]
    assert unscored and all("not finite" in p.not_compared for p in unscored)
    assert not result.departs and not result.conclusive      # a clean engine, but not every piece was compared
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
    assert result.departs and result.suspect.module == "layers.0.mlp.act_fn"
    assert result.suspect.module_class == "SiluAndMul"
    silu = [n for n in result.suspect_nodes if n.op == "silu"]
    assert silu and silu[0].file.endswith("vllm/model_executor/layers/activation.py") and "silu" in silu[0].code
    assert result.passes and result.passes[0].name == "aten.silu.default"
