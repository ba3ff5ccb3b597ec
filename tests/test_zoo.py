"""The tiny model zoo: recipes, the on-disk cache, and (slow) vLLM-vs-HF greedy agreement on every architecture.

The agreement test is what makes the zoo a trustworthy test bed: a correct engine on a zoo model must generate
exactly the tokens HF Transformers generates (both fp32, greedy). If an architecture disagrees, either the zoo
recipe configures something the engine reads differently (sliding window, soft-capping, ...) or the engine has a
bug — in both cases every diagnosis built on that model would start from a false premise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ekka_core import zoo
from ekka_core.errors import BadInput

REPO_ROOT = Path(__file__).resolve().parent.parent
GREEDY_SCRIPT = REPO_ROOT / "tests" / "zoo_greedy_check.py"
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
N_TOKENS = 8
VLLM_TIMEOUT_S = 300
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
    monkeypatch.setitem(zoo._BASE, "num_hidden_layers", 3)
    assert zoo.recipe_hash("llama") != base
    monkeypatch.undo()

    monkeypatch.setattr(zoo, "ZOO_VERSION", zoo.ZOO_VERSION + 1)
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
    start = time.perf_counter()
    second = zoo.build_model("llama", root=tmp_path)
    elapsed = time.perf_counter() - start
    assert second == first
    assert (second / "model.safetensors").stat().st_mtime_ns == stamp
    assert elapsed < 2.0, f"cache hit took {elapsed:.2f}s"
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

def _run_vllm(model_dir: Path, n_tokens: int) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    python = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
    try:
        proc = subprocess.run([python, str(GREEDY_SCRIPT), str(model_dir), str(n_tokens)], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=VLLM_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"vLLM greedy run timed out after {VLLM_TIMEOUT_S}s; stderr tail:\n"
                    f"{(exc.stderr or b'')[-4000:]!r}")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.fail(f"vLLM greedy run failed (exit {proc.returncode}); stderr tail:\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1])


def _hf_greedy(model, prompt_ids: list[int], n_tokens: int):
    """Argmax decoding with a full forward pass per step (no KV cache: the simplest, most trusted reference).
    Returns the generated ids and, per step, (top-1 id, top-1 − top-2 logit margin, logits row)."""
    import torch

    ids = list(prompt_ids)
    generated, steps = [], []
    with torch.no_grad():
        for _ in range(n_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            top2 = torch.topk(logits, 2)
            nxt = int(top2.indices[0])
            steps.append((nxt, float(top2.values[0] - top2.values[1]), logits))
            generated.append(nxt)
            ids.append(nxt)
    return generated, steps


@pytest.fixture(scope="module")
def hf_torch():
    import torch

    torch.manual_seed(0)
    return torch


@pytest.mark.slow
@pytest.mark.parametrize("arch", zoo.known_architectures())
def test_vllm_greedy_matches_hf(arch, zoo_model, hf_torch):
    from transformers import AutoModelForCausalLM

    model_dir = zoo_model(arch)
    vllm_out = _run_vllm(model_dir, N_TOKENS)
    prompts, vllm_generated = vllm_out["prompt_token_ids"], vllm_out["generated"]
    assert len(prompts) == 2 and len(vllm_generated) == 2
    assert len(prompts[1]) >= 40 and len(prompts[0]) < len(prompts[1])
    assert all(len(g) == N_TOKENS for g in vllm_generated), vllm_generated
    vllm_logprobs = vllm_out["generated_logprobs"]

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=hf_torch.float32, attn_implementation="eager")
    model.eval()
    problems = []
    for i, (prompt, got, got_lp) in enumerate(zip(prompts, vllm_generated, vllm_logprobs)):
        want, steps = _hf_greedy(model, prompt, N_TOKENS)
        # Log-probabilities of the generated tokens, as long as both sides are on the same sequence.
        for k, (a, b) in enumerate(zip(got, want)):
            if a != b:
                break
            hf_lp = float(hf_torch.log_softmax(steps[k][2], -1)[a])
            if abs(hf_lp - got_lp[k]) > LOGPROB_ATOL:
                problems.append(f"prompt {i} ({len(prompt)} tokens), generated step {k} (token {a}): "
                                f"vLLM logprob {got_lp[k]:.6f} vs HF {hf_lp:.6f} (|diff| > {LOGPROB_ATOL})")
                break
        if got == want:
            continue
        k = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
        _, margin, logits = steps[k]
        gap = float(logits[want[k]] - logits[got[k]])
        problems.append(
            f"prompt {i} ({len(prompt)} tokens): vLLM {got} != HF {want}; first difference at generated step {k} "
            f"(position {len(prompt) + k}): HF top-1 {want[k]} leads by {margin:.4f} over its runner-up and by "
            f"{gap:.4f} over vLLM's pick {got[k]}; HF margins per step: "
            f"{[round(m, 4) for _, m, _ in steps]}")
    assert not problems, f"{arch}: vLLM greedy output differs from HF Transformers:\n" + "\n".join(problems)
