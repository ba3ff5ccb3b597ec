"""The mapping stage: component mapping between hand-built Model Trees that mimic vLLM (fused) and HF (literal) Llama.

GQA shapes as in the zoo: hidden 256, 4 heads × 64, 2 KV heads × 64 → q 256, k 128, v 128; intermediate 512.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from ekka_core.mapping import ComponentPair, Endpoint, Mapping, Unmapped, map_components
from ekka_core.tree import ModelTree, ModuleNode

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
N_LAYERS = 2


def _tree(framework: str, spec: list[tuple[str, str, int | None]], declared: dict | None = None,
          shared: set[str] = frozenset()) -> ModelTree:
    tree = ModelTree(framework, declared=declared or {})
    for i, (name, cls, out) in enumerate(spec):
        tree.modules[name] = ModuleNode(name, cls, f"pkg.{cls}", f"/src/{framework}/{cls.lower()}.py", 10 + i,
                                        f"/src/{framework}/{cls.lower()}.py", 20 + i, calls=1, first_call=i,
                                        shared=name in shared, out_features=out)
    return tree


def vllm_tree(extra: list[tuple[str, str, int | None]] = (), declared: dict | None = None,
              prefix: str = "") -> ModelTree:
    m = f"{prefix}model"
    spec: list[tuple[str, str, int | None]] = [(f"{m}.embed_tokens", "VocabParallelEmbedding", 256)]
    for i in range(N_LAYERS):
        L = f"{m}.layers.{i}"
        spec += [
            (f"{L}.input_layernorm", "RMSNorm", 256),
            (f"{L}.self_attn.qkv_proj", "QKVParallelLinear", 512),
            (f"{L}.self_attn.rotary_emb", "RotaryEmbedding", 256),
            (f"{L}.self_attn.attn", "Attention", 256),
            (f"{L}.self_attn.o_proj", "RowParallelLinear", 256),
            (f"{L}.self_attn", "LlamaAttention", 256),
            (f"{L}.post_attention_layernorm", "RMSNorm", 256),
            (f"{L}.mlp.gate_up_proj", "MergedColumnParallelLinear", 1024),
            (f"{L}.mlp.act_fn", "SiluAndMul", 512),
            (f"{L}.mlp.down_proj", "RowParallelLinear", 256),
            (f"{L}.mlp", "LlamaMLP", 256),
            (L, "LlamaDecoderLayer", 256),
        ]
    spec += [(f"{m}.norm", "RMSNorm", 256), (m, "LlamaModel", 256), (f"{prefix}logits_processor", "LogitsProcessor", 512),
             ("", "LlamaForCausalLM", 256)]
    spec += list(extra)
    rotary = {f"{m}.layers.{i}.self_attn.rotary_emb" for i in range(N_LAYERS)}
    return _tree("vllm", spec, {"packed_modules_mapping": PACKED, **(declared or {})}, shared=rotary)


def hf_tree(embed_cls: str = "Embedding") -> ModelTree:
    spec: list[tuple[str, str, int | None]] = [("model.embed_tokens", embed_cls, 256),
                                               ("model.rotary_emb", "LlamaRotaryEmbedding", 64)]
    for i in range(N_LAYERS):
        L = f"model.layers.{i}"
        spec += [
            (f"{L}.input_layernorm", "LlamaRMSNorm", 256),
            (f"{L}.self_attn.q_proj", "Linear", 256),
            (f"{L}.self_attn.k_proj", "Linear", 128),
            (f"{L}.self_attn.v_proj", "Linear", 128),
            (f"{L}.self_attn.o_proj", "Linear", 256),
            (f"{L}.self_attn", "LlamaAttention", 256),
            (f"{L}.post_attention_layernorm", "LlamaRMSNorm", 256),
            (f"{L}.mlp.gate_proj", "Linear", 512),
            (f"{L}.mlp.act_fn", "SiLUActivation", 512),
            (f"{L}.mlp.up_proj", "Linear", 512),
            (f"{L}.mlp.down_proj", "Linear", 256),
            (f"{L}.mlp", "LlamaMLP", 256),
            (L, "LlamaDecoderLayer", 256),
        ]
    spec += [("model.norm", "LlamaRMSNorm", 256), ("model", "LlamaModel", 256), ("lm_head", "Linear", 512),
             ("", "LlamaForCausalLM", 512)]
    return _tree("hf", spec)


@pytest.fixture
def mapping() -> Mapping:
    return map_components(vllm_tree(), hf_tree())


def _unmapped(m: Mapping, name: str) -> Unmapped | None:
    return next((u for u in m.unmapped if u.module == name), None)


def test_frameworks_are_recorded(mapping):
    assert (mapping.target_framework, mapping.reference_framework) == ("vllm", "hf")


def test_every_target_module_is_mapped_or_explained_exactly_once(mapping):
    names = [p.component for p in mapping.pairs] + [u.module for u in mapping.unmapped]
    assert sorted(names) == sorted(vllm_tree().modules)
    assert all(u.reason for u in mapping.unmapped)
    assert mapping.validate(vllm_tree().modules) == []


@pytest.mark.parametrize("layer", range(N_LAYERS))
def test_qkv_proj_is_one_to_n_with_gqa_split_sizes(mapping, layer):
    L = f"model.layers.{layer}.self_attn"
    p = mapping.pair(f"{L}.qkv_proj")
    assert p is not None and p.relation == "1:N"
    assert p.target.modules == [f"{L}.qkv_proj"]
    assert p.reference.modules == [f"{L}.q_proj", f"{L}.k_proj", f"{L}.v_proj"]   # concatenation order
    assert p.reference.split_sizes == [256, 128, 128]
    assert sum(p.reference.split_sizes) == vllm_tree().modules[f"{L}.qkv_proj"].out_features
    assert "packed_modules_mapping" in p.rule


def test_gate_up_proj_is_one_to_n(mapping):
    p = mapping.pair("model.layers.0.mlp.gate_up_proj")
    assert p is not None and p.relation == "1:N"
    assert p.reference.modules == ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    assert p.reference.split_sizes == [512, 512]


def test_fused_gated_activation_maps_to_input_of_down_proj(mapping):
    # HF's own act_fn (silu of gate only) sits at the same path but computes something else: must not be used.
    p = mapping.pair("model.layers.1.mlp.act_fn")
    assert p is not None and p.relation == "1:1"
    assert p.reference.modules == ["model.layers.1.mlp.down_proj"] and p.reference.port == "input"
    assert p.target.port == "output"


def test_attention_kernel_maps_to_input_of_o_proj(mapping):
    p = mapping.pair("model.layers.0.self_attn.attn")
    assert p is not None
    assert p.reference.modules == ["model.layers.0.self_attn.o_proj"] and p.reference.port == "input"
    assert p.target.port == "output"


def test_logits_processor_maps_to_reference_root_logits_on_sampled_rows(mapping):
    p = mapping.pair("logits_processor")
    assert p is not None
    assert p.reference.modules == [""] and p.reference.select == "named:logits"
    assert p.rows == "sampled"


def test_rotary_embedding_is_unmapped_with_a_reason(mapping):
    for i in range(N_LAYERS):
        name = f"model.layers.{i}.self_attn.rotary_emb"
        assert mapping.pair(name) is None
        u = _unmapped(mapping, name)
        assert u is not None and u.cls == "RotaryEmbedding"
        assert u.reason and u.status == "explained" and not u.open


def test_decoder_layer_compares_the_summed_residual_stream(mapping):
    p = mapping.pair("model.layers.0")
    assert p is not None and p.relation == "1:1" and p.rule.startswith("same-path")
    assert p.target.select == "stream" and p.reference.select == "first"
    assert p.reference.modules == ["model.layers.0"]
    # plain 1:1 modules compare their inputs too; non-layers select the first output
    q = mapping.pair("model.layers.0.mlp.down_proj")
    assert q is not None and q.target.select == "first" and q.compare_inputs is True


def test_sglang_decoder_layers_are_compared_through_their_parts_not_their_output():
    """SGLang ≥ 0.5 returns a layer's MLP contribution and keeps the residual elsewhere (read from its 0.5.23
    llama.py): a same-path layer pair would be divergent on a correct engine. Its parts still map."""
    target = vllm_tree()
    target.framework = "sglang"
    m = map_components(target, hf_tree())
    u = _unmapped(m, "model.layers.0")
    assert u is not None and "residual stream outside the decoder layer" in u.reason
    assert m.pair("model.layers.0") is None and m.pair("model.layers.0.mlp.down_proj") is not None
    assert m.validate(target.modules) == []


def test_root_is_unmapped_with_a_reason(mapping):
    u = _unmapped(mapping, "")
    assert u is not None and u.reason and u.status == "explained"


def test_module_without_counterpart_is_unmapped_and_validate_lists_it():
    target = vllm_tree(extra=[("model.layers.0.mlp.fancy_scaler", "FancyScaler", 256)])
    m = map_components(target, hf_tree())
    u = _unmapped(m, "model.layers.0.mlp.fancy_scaler")
    assert u is not None and u.cls == "FancyScaler" and u.status == "no-rule" and u.open
    problems = m.validate(target.modules)
    assert len(problems) == 1 and problems[0].startswith("model.layers.0.mlp.fancy_scaler")


def test_sampler_is_unmapped_for_a_stated_reason():
    target = vllm_tree(extra=[("sampler", "Sampler", None)])
    m = map_components(target, hf_tree())
    u = _unmapped(m, "sampler")
    assert u is not None and u.reason and u.status == "explained"
    assert m.validate(target.modules) == []


def test_validate_reports_a_module_neither_mapped_nor_explained(mapping):
    mapping.pairs = [p for p in mapping.pairs if p.component != "model.norm"]
    problems = mapping.validate(vllm_tree().modules)
    assert problems == ["model.norm: neither mapped nor explained"]


def test_hf_to_vllm_mapper_prefix_renames_reference_paths():
    target = vllm_tree(prefix="language_model.",
                       declared={"hf_to_vllm_mapper": {"orig_to_new_prefix": {"model.": "language_model.model."}}})
    m = map_components(target, hf_tree())
    p = m.pair("language_model.model.layers.0.mlp.down_proj")
    assert p is not None and p.reference.modules == ["model.layers.0.mlp.down_proj"]
    qkv = m.pair("language_model.model.layers.1.self_attn.qkv_proj")
    assert qkv is not None and qkv.reference.modules[0] == "model.layers.1.self_attn.q_proj"
    assert qkv.reference.split_sizes == [256, 128, 128]


def test_embedding_normaliser_is_applied_as_a_scale_only_when_reference_scales_inside_the_module():
    scaled = map_components(vllm_tree(declared={"embedding_normalizer": 16.0}),
                            hf_tree("Gemma3TextScaledWordEmbedding"))
    p = scaled.pair("model.embed_tokens")
    assert p is not None and p.target.scale == 16.0 and p.compare_inputs is False
    plain = map_components(vllm_tree(declared={"embedding_normalizer": 16.0}), hf_tree("Embedding"))
    assert plain.pair("model.embed_tokens").target.scale is None


def test_save_load_round_trip(mapping, tmp_path):
    path = tmp_path / "mapping.json"
    mapping.save(path)
    assert json.loads(path.read_text())["schema"] == "ekka.mapping/1"
    loaded = Mapping.load(path)
    assert loaded == mapping
    assert isinstance(loaded.pairs[0], ComponentPair) and isinstance(loaded.pairs[0].target, Endpoint)
    assert asdict(loaded) == asdict(mapping)


def test_edited_mapping_loads_the_edit(mapping, tmp_path):
    path = tmp_path / "mapping.json"
    mapping.save(path)
    d = json.loads(path.read_text())
    d["unmapped"].append({"module": "x.y", "cls": "Z", "reason": "explained by hand"})
    path.write_text(json.dumps(d))
    loaded = Mapping.load(path)
    assert loaded != mapping and _unmapped(loaded, "x.y").reason == "explained by hand"


def test_aligner_source_round_trips_and_old_mappings_without_it_still_load(mapping, tmp_path):
    path = tmp_path / "mapping.json"
    mapping.pair("model.layers.0.mlp.act_fn").aligner = "def align(target, reference, meta):\n    return 1, 1\n"
    mapping.save(path)
    assert Mapping.load(path) == mapping
    d = json.loads(path.read_text())
    for p in d["pairs"]:
        del p["aligner"]                                    # a mapping.json written before the field existed
    path.write_text(json.dumps(d))
    old = Mapping.load(path)
    assert all(p.aligner is None for p in old.pairs) and len(old.pairs) == len(mapping.pairs)


def test_rules_off_leaves_every_module_to_the_agent(monkeypatch):
    from ekka_core.mapping import RULES_OFF_REASON, rules_enabled
    target = vllm_tree()
    off = map_components(target, hf_tree(), rules=False)
    assert off.pairs == [] and [u.module for u in off.unmapped] == list(target.modules)
    assert all(u.reason == RULES_OFF_REASON and u.status == "rules-off" and u.open for u in off.unmapped)
    monkeypatch.setenv("EKKA_MAPPING_RULES", "off")
    assert not rules_enabled() and map_components(target, hf_tree()).pairs == []
    assert map_components(target, hf_tree(), rules=True).pairs                 # the keyword wins
    assert rules_enabled({"EKKA_MAPPING_RULES": "on"}) and rules_enabled({})


def test_unmapped_status_round_trips_and_old_files_infer_it_from_the_reason(mapping, tmp_path):
    path = tmp_path / "mapping.json"
    mapping.save(path)
    d = json.loads(path.read_text())
    assert {u["status"] for u in d["unmapped"]} == {"explained"}       # the status is written out
    assert Mapping.load(path) == mapping
    old = [("no rule: no reference module at this path", "no-rule"),
           ("no rule: the mapping rules are disabled (EKKA_MAPPING_RULES=off)", "rules-off"),
           ("unchecked: API timed out", "unchecked"), ("agent: a draft head", "agent-explained"),
           ("knowledge base: a draft head", "agent-explained"),
           ("compared as part of model.layers.0.mlp.fused (N:1)", "agent-mapped"),
           ("model root: compared piecewise", "explained")]
    for u in d["unmapped"]:
        del u["status"]                                    # a mapping.json written before statuses existed
    d["unmapped"] += [{"module": f"m{i}", "cls": "X", "reason": r} for i, (r, _) in enumerate(old)]
    path.write_text(json.dumps(d))
    loaded = Mapping.load(path)
    assert [_unmapped(loaded, f"m{i}").status for i in range(len(old))] == [s for _, s in old]
    assert [u.module for u in loaded.unmapped if u.open] == ["m0", "m1"]
    problems = loaded.validate([])
    assert [p.split(":")[0] for p in problems] == ["m0", "m1"]


def test_validate_decides_by_status_not_by_the_reason_wording():
    target = vllm_tree(extra=[("model.layers.0.mlp.fancy_scaler", "FancyScaler", 256)])
    m = map_components(target, hf_tree())
    u = _unmapped(m, "model.layers.0.mlp.fancy_scaler")
    u.reason = "a hand-written reason that says nothing about rules"
    assert len(m.validate(target.modules)) == 1                         # still open
    u.status = "explained"
    u.reason = "no rule: wording left over from an edit"
    assert m.validate(target.modules) == []                             # explained, whatever the wording
