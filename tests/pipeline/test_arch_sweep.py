"""The architecture sweep (issue 24): its candidates, the generated tiny recipes, the generic injected bug, the choice
of injection targets — fast, no engine — and (slow) one architecture per structural family through
``ekka bench --archs``: clean consistent, each injected module at rank 1."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ekka_core import bugs, zoo
from ekka_core.bench_archs import ArchResult, choose_targets, markdown_table, probe_table, summarize
from ekka_core.bugs import generic
from ekka_core.contracts.errors import BadInput
from ekka_core.zoo import sweep

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def cands():
    return sweep.candidates()


# --- candidates -------------------------------------------------------------------------------------------------

def test_candidates_are_stable_sorted_and_every_exclusion_says_why(cands):
    assert sweep.candidates() == cands                       # cached, and the same list every time
    hf = [c.model_type for c in cands if c.model_type]
    assert hf == sorted(hf)
    for c in cands:
        if c.included:
            assert c.vllm_class and c.vllm_module.startswith("vllm.") and c.vllm_impl and c.hf_class, c
            assert c.family in ("dense", "moe", "mla", "mla-moe"), c
            assert not c.reason, c
        else:
            assert c.reason, c


def test_the_sweep_covers_the_architectures_both_implement_natively(cands):
    included = {c.model_type for c in cands if c.included}
    for mt in ("llama", "mixtral", "qwen2_moe", "olmoe", "cohere", "cohere2", "falcon", "gpt2", "gptj", "bloom",
               "opt", "stablelm", "glm4", "glm4_moe", "deepseek_v2", "deepseek_v3", "ernie4_5", "ernie4_5_moe",
               "exaone4", "minicpm3", "nemotron", "granitemoe", "phi3", "llama4_text", "gemma3n_text", "gpt_oss",
               "apertus", "hyperclovax", "phimoe"):
        assert mt in included, mt
    assert len(included) >= 40
    # the class name differs only in spelling: the checkpoint names vLLM's
    phimoe = sweep.candidate("phimoe")
    assert (phimoe.hf_class, phimoe.vllm_class) == ("PhimoeForCausalLM", "PhiMoEForCausalLM")
    assert sweep.generated_recipe("phimoe")["_architectures"] == ["PhiMoEForCausalLM"]


@pytest.mark.parametrize("model_type,why", [
    ("mamba", "hybrid/SSM"), ("jamba", "hybrid/SSM"), ("zamba2", "hybrid/SSM"), ("falcon_h1", "hybrid/SSM"),
    ("nemotron_h", "hybrid/SSM"), ("granitemoehybrid", "hybrid/SSM"), ("qwen3_next", "hybrid/SSM"),
    ("lfm2", "hybrid/SSM"), ("llama4", "multimodal"), ("qwen3_5", "multimodal"),
    ("gpt_neox", "Transformers backend"), ("olmo2", "Transformers backend"), ("starcoder2", "Transformers backend"),
    ("phi", "Transformers backend"), ("gpt_bigcode", "Transformers backend"), ("persimmon", "removed from vLLM"),
    ("gpt-sw3", "alias of gpt2"), ("bert", "no vLLM implementation"),
])
def test_exclusions_carry_their_reason(model_type, why):
    c = sweep.candidate(model_type)
    assert not c.included and why in c.reason, c


def test_remote_code_only_architectures_are_listed_excluded(cands):
    remote = {c.vllm_class: c for c in cands if not c.model_type}
    assert "InternLM2ForCausalLM" in remote
    assert all("remote code only" in c.reason and not c.included for c in remote.values())


# --- generated recipes ------------------------------------------------------------------------------------------

def _config(model_type: str):
    from transformers import AutoConfig

    r = dict(sweep.generated_recipe(model_type))
    r.pop("_architectures", None)
    return AutoConfig.for_model(r.pop("model_type"), **r)


@pytest.mark.parametrize("model_type", [c.model_type for c in sweep.included()])
def test_generated_recipe_is_tiny_and_keeps_the_class_defaults(model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    c = sweep.candidate(model_type)
    recipe = sweep.generated_recipe(model_type)
    assert recipe["model_type"] == model_type and recipe["architectures"] == [c.hf_class]
    assert sweep.generated_recipe(model_type) == recipe                 # deterministic
    cfg = _config(model_type)
    default = CONFIG_MAPPING[model_type]()
    assert cfg.hidden_size == 256 and cfg.vocab_size == 512
    # 4 layers under the class's own name (Longcat-Flash counts two sublayers per layer, HRM unrolls its cycles)
    assert [recipe[k] for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers") if k in recipe] == [4]
    assert cfg.num_attention_heads == 4
    assert cfg.tie_word_embeddings == default.tie_word_embeddings
    assert getattr(cfg, "initializer_range", getattr(cfg, "init_std", None)) == 0.08
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    if "mla" not in c.family:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        assert head_dim == 64, head_dim                          # vLLM's CPU attention rejects 16
        kv = getattr(cfg, "num_key_value_heads", None)
        assert kv is None or kv <= 2
    else:
        assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (512, 64)   # vLLM-CPU's MLA kernels: 512 + 64
    if "moe" in c.family:
        experts = next(getattr(cfg, k) for k in ("num_experts", "num_local_experts", "n_routed_experts",
                                                 "moe_num_experts") if getattr(cfg, k, None) is not None) \
            if c.model_type != "dbrx" else cfg.ffn_config.moe_num_experts
        assert experts == 4
    windows = getattr(cfg, "sliding_window", None)
    if getattr(default, "sliding_window", None):
        assert windows == 16
    types = getattr(cfg, "layer_types", None)
    if isinstance(getattr(default, "layer_types", None), list) and types is not None:
        assert len(types) == 4 and set(types) == set(default.layer_types), types


@pytest.mark.parametrize("model_type", [c.model_type for c in sweep.included() if "moe" in c.family])
def test_layer_1_of_every_moe_model_is_a_moe_layer(model_type):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(_config(model_type), dtype=torch.float32)
    layer1 = [n for n, _ in model.named_parameters() if ".1." in n and "layers.1." in n or ".h.1." in n
              or "blocks.1." in n]
    assert any("expert" in n for n in layer1), layer1


def test_overrides_name_their_reason():
    for model_type, entries in sweep.OVERRIDES.items():
        assert sweep.candidate(model_type).included
        for key, (_value, why) in entries.items():
            assert len(why) > 30, (model_type, key)


def test_sweep_recipes_leave_the_hand_written_zoo_alone():
    before = {a: zoo.recipe_hash(a) for a in zoo.known_architectures()}
    assert zoo.recipe("sweep:llama") != zoo.recipe("llama")
    assert zoo.recipe_hash("sweep:llama") != zoo.recipe_hash("llama")
    assert {a: zoo.recipe_hash(a) for a in zoo.known_architectures()} == before
    assert not any(a.startswith("sweep:") for a in zoo.known_architectures())
    with pytest.raises(BadInput, match="excluded"):
        zoo.recipe("sweep:mamba")
    with pytest.raises(BadInput, match="unknown sweep architecture"):
        zoo.recipe("sweep:no_such_type")


# --- the generic injected bug -----------------------------------------------------------------------------------

def test_generic_bug_names_resolve_through_the_registry():
    bug = bugs.get("scale-output:model.layers.1.mlp:1.5")
    assert bug.name == "scale-output:model.layers.1.mlp:1.5" and not bug.benchmark
    assert bugs.matches(bug, "model.layers.1.mlp") and not bugs.matches(bug, "model.layers.1.mlp.down_proj")
    assert generic.parse(generic.scale_output_name("transformer.h.1.attn.c_proj", 1.5)) == \
        ("transformer.h.1.attn.c_proj", 1.5)
    for bad in ("scale-output:model.layers.1.mlp", "scale-output::1.5", "scale-output:a b:2"):
        with pytest.raises(BadInput):
            bugs.get(bad)
    assert "generic" not in bugs.BUGS and all(not generic.is_generic(n) for n in bugs.BUGS)


def test_scaled_output_is_what_hooks_registered_before_and_after_see():
    import torch
    from torch import nn

    class Linear(nn.Module):          # returns (out, bias) as vLLM's linear layers do
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3, 3))

        def forward(self, x):
            return x @ self.w, None

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = Linear()

        def forward(self, x):
            return self.proj(x)[0]

    model = Model()
    seen = []
    model.proj.register_forward_hook(lambda m, a, out: seen.append(("before", out[0].clone())))
    generic.wrap_module(model, "proj", 2.0)
    model.proj.register_forward_hook(lambda m, a, out: seen.append(("after", out[0].clone())))
    x = torch.ones(1, 3)
    y = model(x)
    assert torch.equal(y, torch.tensor([[6.0, 3.0, 3.0]]))     # the first half of the features, scaled
    assert [w for w, _ in seen] == ["before", "after"] and all(torch.equal(t, y) for _, t in seen)
    assert generic.scaled((torch.ones(2), torch.ones(2)), 3.0)[1].sum() == 2      # only the first tensor
    # a norm after the module cannot undo it (a uniform scale it would)
    out = torch.randn(4, 8)
    rms = lambda t: t / t.pow(2).mean(-1, keepdim=True).sqrt()   # noqa: E731
    assert not torch.allclose(rms(generic.scaled(out, 1.5)), rms(out))
    with pytest.raises(BadInput, match="no module 'proj2'"):
        generic.wrap_module(model, "proj2", 2.0)


# --- injection targets from the vLLM tree -----------------------------------------------------------------------

def _tree(entries: list[tuple[str, str, bool]]) -> dict:
    return {name: SimpleNamespace(cls=cls, weights=["w"] if weighted else []) for name, cls, weighted in entries}


@pytest.mark.parametrize("layout,expected", [
    ([("model.layers.0", "LlamaDecoderLayer", True), ("model.layers.1", "LlamaDecoderLayer", True),
      ("model.layers.1.input_layernorm", "RMSNorm", True), ("model.layers.1.self_attn.qkv_proj", "QKVParallelLinear", True),
      ("model.layers.1.self_attn.attn", "Attention", False),
      ("model.layers.1.self_attn.o_proj", "RowParallelLinear", True), ("model.layers.1.self_attn", "LlamaAttention", True),
      ("model.layers.1.post_attention_layernorm", "RMSNorm", True), ("model.layers.1.mlp", "LlamaMLP", True)],
     ("model.layers.1.mlp", "model.layers.1.self_attn.o_proj")),
    ([("model.decoder.layers.0", "OPTDecoderLayer", True), ("model.decoder.layers.1", "OPTDecoderLayer", True),
      ("model.decoder.layers.1.self_attn.out_proj", "RowParallelLinear", True),
      ("model.decoder.layers.1.self_attn", "OPTAttention", True),
      ("model.decoder.layers.1.self_attn_layer_norm", "LayerNorm", True),
      ("model.decoder.layers.1.fc1", "ColumnParallelLinear", True),
      ("model.decoder.layers.1.activation_fn", "ReLU", False), ("model.decoder.layers.1.fc2", "RowParallelLinear", True)],
     ("model.decoder.layers.1.fc2", "model.decoder.layers.1.self_attn.out_proj")),
    ([("transformer.h.0", "GPT2Block", True), ("transformer.h.1", "GPT2Block", True),
      ("transformer.h.1.ln_1", "LayerNorm", True), ("transformer.h.1.attn.c_attn", "QKVParallelLinear", True),
      ("transformer.h.1.attn.attn", "Attention", False), ("transformer.h.1.attn.c_proj", "RowParallelLinear", True),
      ("transformer.h.1.attn", "GPT2Attention", True), ("transformer.h.1.ln_2", "LayerNorm", True),
      ("transformer.h.1.mlp", "GPT2MLP", True)],
     ("transformer.h.1.mlp", "transformer.h.1.attn.c_proj")),
    ([("model.layers.0", "MixtralDecoderLayer", True), ("model.layers.1", "MixtralDecoderLayer", True),
      ("model.layers.1.self_attn.o_proj", "RowParallelLinear", True), ("model.layers.1.self_attn", "MixtralAttention", True),
      ("model.layers.1.block_sparse_moe.gate", "ReplicatedLinear", True),
      ("model.layers.1.block_sparse_moe", "MixtralMoE", True)],
     ("model.layers.1.block_sparse_moe", "model.layers.1.self_attn.o_proj")),
])
def test_injection_targets_are_layer_1s_mlp_and_attention_output_projection(layout, expected):
    assert choose_targets(_tree(layout)) == expected


def test_tables_render_probe_failures_and_failed_injections():
    from ekka_core.bench_archs import Injected, Probe

    rows = [ArchResult("a", "AForCausalLM", "dense", Probe(built=True, started=False,
                                                           error='start: {"ekka_error": {"message": "vLLM failed to '
                                                                 'start: boom", "exit_code": 3}}')),
            ArchResult("b", "BForCausalLM", "moe", Probe(True, True, True, 0.9, 0.8, "8/8", "8/8", 0.1, 0.1, 0.1, 3.0),
                       clean_verdict="consistent", mlp=Injected("x", "m.1.mlp", "divergent", 1, "m.1.mlp"),
                       attn=Injected("y", "m.1.attn.o", "divergent", 2, "m.1.attn", ["model.layers.1.self_attn"]))]
    summary = summarize(rows, diagnoses=True)
    assert summary["injected_rank1"] == "1/2" and summary["agree"] == "1/2"
    text = markdown_table(json.loads(json.dumps(summary)))
    assert "rank 1 `m.1.attn` (reference model.layers.1.self_attn)" in text
    probe = probe_table(json.loads(json.dumps(summary)))
    assert "vLLM failed to start: boom" in probe and '"ekka_error"' not in probe


def test_cli_refuses_an_excluded_architecture_with_its_reason():
    proc = subprocess.run([sys.executable, "-m", "ekka_core.cli", "bench", "--archs", "--arch", "mamba",
                           "--out", "/nonexistent"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "mamba" in proc.stderr and "hybrid/SSM" in proc.stderr


# --- slow: one architecture per structural family, end to end --------------------------------------------------

# One per structural family outside the hand-written zoo: a decoder layer that returns the stream itself, with
# partial rotary and LayerNorm (stablelm); attention and MLP in parallel off one shared LayerNorm (cohere); parallel
# attention with fused query_key_value and no gated MLP (falcon); routed MoE named differently in vLLM and HF
# (mixtral); a fused qkv the engine regroups at load and attention/MLP blocks that add their residual inside on HF's
# side only (bloom); MoE routing ties carried by attention to later positions (olmoe); a top-level class whose
# compile decorator bypasses the root's hooks (ernie4_5).
SLICE = ["stablelm", "cohere", "falcon", "mixtral", "bloom", "olmoe", "ernie4_5"]


@pytest.mark.slow
def test_one_architecture_per_family_clean_consistent_and_injected_module_at_rank_1(zoo_dir, tmp_path):
    cmd = [sys.executable, "-m", "ekka_core.cli", "bench", "--archs", "--out", str(tmp_path)]
    for mt in SLICE:
        cmd += ["--arch", mt]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    summary = json.loads((tmp_path / "bench-archs.json").read_text())
    rows = {a["model_type"]: ArchResult.from_json(a) for a in summary["archs"]}
    assert list(rows) == SLICE, proc.stdout[-3000:] + proc.stderr[-3000:]
    failures = []
    for mt, r in rows.items():
        if not r.probe.agrees:
            failures.append(f"{mt}: probe {r.probe}")
            continue
        if r.clean_verdict != "consistent":
            failures.append(f"{mt}: clean verdict {r.clean_verdict} (top {r.clean_top}; missing {r.missing})")
        for what, inj in (("MLP", r.mlp), ("attention projection", r.attn)):
            if inj is None or not inj.passed:
                failures.append(f"{mt}: injected {what} {inj}")
    assert not failures, "\n".join(failures)
    assert proc.returncode == 0, proc.stdout[-3000:]
