"""The mapping stage: component mapping between hand-built Model Trees that mimic vLLM (fused) and HF (literal) Llama.

GQA shapes as in the zoo: hidden 256, 4 heads × 64, 2 KV heads × 64 → q 256, k 128, v 128; intermediate 512.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import pytest

from ekka_core.mapping import ComponentPair, Endpoint, Mapping, Unmapped, map_components
from ekka_core.tree import ModelTree, ModuleNode
from owners import derive_weights

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
N_LAYERS = 2


def _tree(framework: str, spec: list[tuple[str, str, int | None]], declared: dict | None = None,
          shared: set[str] = frozenset()) -> ModelTree:
    tree = ModelTree(framework, declared=declared or {})
    for i, (name, cls, out) in enumerate(spec):
        tree.modules[name] = ModuleNode(name, cls, f"pkg.{cls}", f"/src/{framework}/{cls.lower()}.py", 10 + i,
                                        f"/src/{framework}/{cls.lower()}.py", 20 + i, calls=1, first_call=i,
                                        shared=name in shared, out_features=out)
    return derive_weights(tree)


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
    assert p is not None and p.relation == "1:1" and p.rule.startswith("same-weights")
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


# -- pairs come from what both sides compute, never from a name alone ------------------------------------------

GROUNDED_RULES = ("packed_modules_mapping[", "gated-activation", "attention-core", "logits ↔", "rotary ↔",
                  "same-weights", "parameter-free, same place, same widths")


def test_every_pair_is_grounded_in_a_declaration_a_known_computation_or_the_same_weights(mapping):
    """A pair's rule names its ground; a same-weights pair's two sides own the same weights (the reference's
    named as the engine names them)."""
    target, reference = vllm_tree(), hf_tree()
    for p in mapping.pairs:
        assert p.rule.startswith(GROUNDED_RULES), p
        if p.rule.startswith("same-weights"):
            ours = set(target.modules[p.component].weights)
            theirs = {re.sub(r"\.(gate|up)_proj$", ".gate_up_proj", re.sub(r"\.[qkv]_proj$", ".qkv_proj", o))
                      for o in reference.modules[p.reference.modules[0]].weights}
            assert ours == theirs and ours, p


def test_a_name_match_alone_never_makes_a_pair():
    """Same path, other weights (the reference's module also applies a linear the engine's does not) → unmapped,
    with what differs; the layer above, which owns both, still pairs."""
    reference = hf_tree()
    ref_mlp = reference.modules["model.layers.0.mlp"]
    reference.modules["model.layers.0.mlp.scaler"] = ModuleNode("model.layers.0.mlp.scaler", "Linear", "pkg.Linear",
                                                                None, None, None, None, out_features=256)
    ref_mlp.weights = sorted(ref_mlp.weights + ["model.layers.0.mlp.scaler"])
    target = vllm_tree()
    target.modules["model.layers.0"].weights.append("model.layers.0.mlp.scaler")   # the layer owns it on both sides
    reference.modules["model.layers.0"].weights.append("model.layers.0.mlp.scaler")
    m = map_components(target, reference)
    assert m.pair("model.layers.0.mlp") is None
    u = _unmapped(m, "model.layers.0.mlp")
    assert u is not None and not u.open
    assert "same place, other weights" in u.reason and "model.layers.0.mlp.scaler" in u.reason
    assert m.pair("model.layers.1.mlp") is not None                # the unchanged layer still pairs
    assert m.pair("model.layers.0.mlp.down_proj") is not None      # so do the parts


def test_a_parameter_free_module_consuming_another_width_is_unmapped_with_its_reason():
    """vLLM's SiluAndMul consumes [gate|up] (2·I) and multiplies; HF's act_fn consumes gate (I). Where no rule
    knows the fused activation (no down_proj beside it), the name match must not pair them."""
    target = vllm_tree(extra=[("model.layers.0.extra.act", "FusedActThing", 512)])
    reference = hf_tree()
    reference.modules["model.layers.0.extra.act"] = ModuleNode("model.layers.0.extra.act", "SiLUActivation", "pkg",
                                                               None, None, None, None, out_features=512,
                                                               in_features=512, weights=[])
    target.modules["model.layers.0.extra.act"].in_features = 1024
    m = map_components(target, reference)
    u = _unmapped(m, "model.layers.0.extra.act")
    assert m.pair("model.layers.0.extra.act") is None
    assert u is not None and "consumes width 1024" in u.reason and "512" in u.reason
    # Same widths both ways: a plain activation at its place pairs, and says on what ground.
    target.modules["model.layers.0.extra.act"].in_features = 512
    p = map_components(target, reference).pair("model.layers.0.extra.act")
    assert p is not None and p.rule.startswith("parameter-free")


def test_a_trace_without_weight_ownership_pairs_nothing_by_name():
    target, reference = vllm_tree(), hf_tree()
    for node in target.modules.values():
        node.weights = None
    m = map_components(target, reference)
    assert m.pair("model.layers.0.mlp.down_proj") is None and m.pair("model.layers.0") is None
    u = _unmapped(m, "model.layers.0.mlp.down_proj")
    assert u is not None and "does not record which weights" in u.reason
    # What the engine declares (packed modules) and known computations still pair.
    assert m.pair("model.layers.0.self_attn.qkv_proj") is not None and m.pair("model.layers.0.mlp.act_fn") is not None


def test_same_weights_at_another_path_pairs_without_a_declared_rename():
    """A module the engine calls under another path than the checkpoint's (a wrapper holding the block, its
    parameters registered at the checkpoint's names — as vLLM's fused-MoE runner holds the shared expert): the
    reference module computing with exactly the same weights is its counterpart, wherever it sits — when it is the
    only one."""
    target = vllm_tree()
    renamed = ModelTree("vllm", declared=target.declared)
    for name, node in target.modules.items():
        new = name.replace("layers.0.mlp", "layers.0.ffn_runner._block")
        node.name = new
        renamed.modules[new] = node
    m = map_components(renamed, hf_tree())
    p = m.pair("model.layers.0.ffn_runner._block.down_proj")
    assert p is not None and p.reference.modules == ["model.layers.0.mlp.down_proj"]
    assert p.rule.startswith("same-weights (at another path)")
    assert m.pair("model.layers.0.ffn_runner._block").reference.modules == ["model.layers.0.mlp"]


def _qwen2_moe_trees() -> tuple[ModelTree, ModelTree]:
    """Layer 0 of Qwen2-MoE as vLLM 0.32 runs it and HF 5 defines it (read from both sources): vLLM's fused-MoE
    layer calls the shared expert itself (call site ``experts._shared_experts._layer``, registered as the block's
    ``shared_expert``), and that shared expert multiplies by ``sigmoid(shared_expert_gate(x))`` inside its own
    forward; HF's block applies that gate after its shared expert returns."""
    B, S = "model.layers.0.mlp", "model.layers.0.mlp.experts._shared_experts._layer"
    t_spec = [(f"{B}.gate", "GateLinear", 4), (f"{S}.gate_up_proj", "MergedColumnParallelLinear", 256),
              (f"{S}.act_fn", "SiluAndMul", 128), (f"{S}.down_proj", "RowParallelLinear", 256),
              (f"{S}.expert_gate", "ReplicatedLinear", 1), (S, "Qwen2MoeMLP", 256),
              (f"{B}.experts", "FusedMoE", 256), (B, "Qwen2MoeSparseMoeBlock", 256)]
    target = _tree("vllm", t_spec, {"packed_modules_mapping": PACKED})
    registered = {S: f"{B}.shared_expert", f"{S}.expert_gate": f"{B}.shared_expert_gate"}
    for name, node in target.modules.items():
        if name.startswith(S):
            node.registered = registered.get(name, name.replace(S, f"{B}.shared_expert"))
    owners = {f"{B}.gate", f"{B}.shared_expert.gate_up_proj", f"{B}.shared_expert.down_proj",
              f"{B}.shared_expert_gate", f"{B}.experts"}
    shared = sorted(o for o in owners if "shared" in o)
    weights = {f"{B}.gate": [f"{B}.gate"], f"{S}.gate_up_proj": [f"{B}.shared_expert.gate_up_proj"],
               f"{S}.act_fn": [], f"{S}.down_proj": [f"{B}.shared_expert.down_proj"],
               f"{S}.expert_gate": [f"{B}.shared_expert_gate"], S: shared,
               f"{B}.experts": sorted([f"{B}.experts"] + shared), B: sorted(owners)}
    for name, w in weights.items():
        target.modules[name].weights = w
    target.modules[f"{S}.act_fn"].in_features = 256
    H = f"{B}.shared_expert"
    r_spec = [(f"{B}.gate", "Qwen2MoeTopKRouter", 4), (f"{B}.experts", "Qwen2MoeExperts", 256),
              (f"{H}.gate_proj", "Linear", 128), (f"{H}.act_fn", "SiLUActivation", 128), (f"{H}.up_proj", "Linear", 128),
              (f"{H}.down_proj", "Linear", 256), (H, "Qwen2MoeMLP", 256), (f"{B}.shared_expert_gate", "Linear", 1),
              (B, "Qwen2MoeSparseMoeBlock", 256)]
    reference = _tree("hf", r_spec)
    reference.modules[f"{B}.gate"].weights = [f"{B}.gate"]          # a router class: owns its linear's weight
    reference.modules[B].weights = sorted(reference.modules[B].weights + [f"{B}.gate"])
    reference.modules[f"{H}.act_fn"].in_features = 128
    return target, reference


def test_qwen2_moe_shared_expert_called_inside_the_fused_moe_layer():
    """Issue 24's Qwen2-MoE: the shared expert's SiluAndMul was paired with HF's act_fn by name, and blamed. Now
    its parts map through the name vLLM registered them under; the shared expert (it applies the gate HF applies
    outside) and the fused experts (routed + shared) are unmapped, saying why; the block pairs (same weights)."""
    target, reference = _qwen2_moe_trees()
    m = map_components(target, reference)
    B, S = "model.layers.0.mlp", "model.layers.0.mlp.experts._shared_experts._layer"
    act = m.pair(f"{S}.act_fn")
    assert act is not None and act.reference.modules == [f"{B}.shared_expert.down_proj"]
    assert act.reference.port == "input" and act.rule.startswith("gated-activation")
    gate_up = m.pair(f"{S}.gate_up_proj")
    assert gate_up is not None and gate_up.reference.modules == [f"{B}.shared_expert.gate_proj",
                                                                 f"{B}.shared_expert.up_proj"]
    assert m.pair(f"{S}.down_proj").reference.modules == [f"{B}.shared_expert.down_proj"]
    assert m.pair(f"{S}.expert_gate").reference.modules == [f"{B}.shared_expert_gate"]
    shared = _unmapped(m, S)
    assert shared is not None and m.pair(S) is None
    assert f"{B}.shared_expert_gate" in shared.reason and "outside" in shared.reason
    experts = _unmapped(m, f"{B}.experts")
    assert experts is not None and m.pair(f"{B}.experts") is None and "shared_expert" in experts.reason
    block = m.pair(B)
    assert block is not None and block.reference.modules == [B] and block.rule.startswith("same-weights")
    assert m.validate(target.modules) == []


def test_weight_sums_survive_what_engines_do_to_weights_at_load():
    """Concatenated (qkv), stacked (experts), transposed, zero-padded (vocabulary), held in fp32 on one side and
    bf16 on the other: the same values give the same sums; another tensor of the same shape does not."""
    import torch

    from ekka_core.capture.hooks import weight_sums
    from ekka_core.mapping.rules import _same_sums
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(64, 32, generator=g) for _ in range(3))
    parts = weight_sums([q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)])
    assert _same_sums(weight_sums([torch.cat([q, k, v])]), parts)                       # fp32, fused
    assert _same_sums(weight_sums([torch.stack([q, k, v]).transpose(1, 2)]), parts)     # stacked, transposed
    assert _same_sums(weight_sums([torch.cat([q, k, v, torch.zeros(8, 32)])]), parts)   # padded rows
    other = torch.randn(192, 32, generator=g)
    assert not _same_sums(weight_sums([other]), parts)
    assert not _same_sums(weight_sums([torch.zeros(4)]), weight_sums([torch.zeros(4)]))   # nothing to tell by
    # vLLM-CPU's linears keep an empty `weight` once oneDNN holds the values: summed as nothing, not a crash
    assert weight_sums([torch.empty(0), torch.empty(0, 32)])[:2] == [0.0, 0.0]


def test_same_weights_by_value_pairs_modules_the_two_frameworks_name_differently():
    """vLLM's Mixtral names its MoE block `block_sparse_moe`, HF 5's `mlp`, and no mapper says so: the block and
    its router pair because they compute with the same values; a module whose values differ does not."""
    target, reference = vllm_tree(), hf_tree()
    renamed = ModelTree("vllm", declared=target.declared)
    for name, node in target.modules.items():
        new = name.replace(".mlp", ".block_sparse_moe")
        node.name = new
        node.weights = [w.replace(".mlp", ".block_sparse_moe") for w in node.weights]
        renamed.modules[new] = node
    values: dict[str, list[float]] = {}
    for i, owner in enumerate(sorted({o for n in reference.modules.values() for o in n.weights})):
        values[owner] = [0.5 * i - 3.0, 10.0 + 7.0 * i]
    reference.weight_sums = values
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    for owner in {o for n in renamed.modules.values() for o in n.weights}:
        parent, leaf = owner.replace(".block_sparse_moe", ".mlp").rsplit(".", 1)
        parts = [f"{parent}.{p}" for p in fused.get(leaf, (leaf,))]
        renamed.weight_sums[owner] = [sum(values[p][0] for p in parts), sum(values[p][1] for p in parts)]
    m = map_components(renamed, reference)
    block = m.pair("model.layers.0.block_sparse_moe")
    assert block is not None and block.reference.modules == ["model.layers.0.mlp"]
    assert "by value" in block.rule and "at another path" in block.rule
    assert m.pair("model.layers.1.block_sparse_moe.down_proj").reference.modules == ["model.layers.1.mlp.down_proj"]
    renamed.weight_sums["model.layers.1.block_sparse_moe.down_proj"][0] += 1.0     # other values: no pair
    m = map_components(renamed, reference)
    assert m.pair("model.layers.1.block_sparse_moe.down_proj") is None
    assert m.pair("model.layers.1.block_sparse_moe") is None


def test_attention_kernel_maps_to_the_input_of_whatever_projection_the_reference_calls_last():
    """GPT-2 names its output projection c_proj (Falcon dense, OPT out_proj): by call order and width, the
    reference attention's last weighted child consuming what the kernel produces. The attention *block* of GPT-2 is
    also named `attn`: it holds weights, so it is no kernel."""
    A = "transformer.h.0.attn"
    target = derive_weights(_tree("vllm", [(f"{A}.c_attn", "QKVParallelLinear", 768), (f"{A}.attn", "Attention", 256),
                                           (f"{A}.c_proj", "RowParallelLinear", 256), (A, "GPT2Attention", 256)]))
    reference = derive_weights(_tree("hf", [(f"{A}.c_attn", "Conv1DLinear", 768), (f"{A}.c_proj", "Conv1DLinear", 256),
                                            (A, "GPT2Attention", 256)]))
    reference.modules[f"{A}.c_proj"].in_features = 256
    m = map_components(target, reference)
    kernel = m.pair(f"{A}.attn")
    assert kernel is not None and kernel.reference.modules == [f"{A}.c_proj"] and kernel.reference.port == "input"
    block = m.pair(A)
    assert block is not None and block.reference.modules == [A] and block.rule.startswith("same-weights")
    # a projection consuming another width is not what the kernel feeds
    reference.modules[f"{A}.c_proj"].in_features = 512
    assert map_components(target, reference).pair(f"{A}.attn") is None


def test_the_order_statistic_sees_weights_the_engine_reorders_and_nothing_else():
    """Σ(i+j)·w: unchanged by a transpose (vLLM's GPT-2 loads HF's Conv1D weights transposed) and by zero rows
    appended (a padded vocabulary); changed when the same values come in another order (BLOOM's qkv)."""
    import torch

    from ekka_core.capture.hooks import weight_sums
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(48, 16, generator=g), torch.randn(48, generator=g)
    base = weight_sums([w, b])
    assert len(base) == 4
    assert weight_sums([w.t().contiguous(), b])[2] == pytest.approx(base[2], rel=1e-12)
    assert weight_sums([torch.cat([w, torch.zeros(16, 16)]), torch.cat([b, torch.zeros(16)])])[2] == \
        pytest.approx(base[2], rel=1e-12)
    # BLOOM's regrouping: (heads, 3, head_dim) → (3, heads, head_dim) on the output rows
    regroup = lambda t: t.view(4, 3, 4, *t.shape[1:]).transpose(0, 1).reshape(t.shape)  # noqa: E731
    moved = weight_sums([regroup(w), regroup(b)])
    assert moved[:2] == pytest.approx(base[:2], rel=1e-12)          # the same values
    assert abs(moved[2] - base[2]) > 1e-3 * base[3] * base[1] ** 0.5  # in another order
    assert len(weight_sums([torch.randn(2, 3, 4, generator=g)])) == 2   # stacked experts: order not claimed


def _reordered_pair_trees(reorder: bool) -> tuple[ModelTree, ModelTree]:
    import torch

    from ekka_core.capture.hooks import weight_sums
    target, reference = vllm_tree(), hf_tree()
    g = torch.Generator().manual_seed(2)
    for owner in sorted({o for n in reference.modules.values() for o in n.weights}):
        reference.weight_sums[owner] = weight_sums([torch.randn(8, 4, generator=g)])
    for owner in {o for n in target.modules.values() for o in n.weights}:
        parent, leaf = owner.rsplit(".", 1)
        parts = [f"{parent}.{p}" for p in PACKED.get(leaf, [leaf])]
        s = [reference.weight_sums[p] for p in parts]
        target.weight_sums[owner] = [sum(x[0] for x in s), sum(x[1] for x in s), sum(x[2] for x in s),
                                     sum(x[3] for x in s)] if len(parts) == 1 else [sum(x[0] for x in s),
                                                                                     sum(x[1] for x in s)]
    if reorder:
        target.weight_sums["model.layers.1.self_attn.o_proj"][2] += 50.0 * target.weight_sums[
            "model.layers.1.self_attn.o_proj"][1] ** 0.5
    return target, reference


def test_the_same_weights_in_another_order_are_unmapped_with_the_reason():
    target, reference = _reordered_pair_trees(reorder=False)
    m = map_components(target, reference)
    assert m.pair("model.layers.1.self_attn.o_proj").reference.modules == ["model.layers.1.self_attn.o_proj"]
    target, reference = _reordered_pair_trees(reorder=True)
    m = map_components(target, reference)
    assert m.pair("model.layers.1.self_attn.o_proj") is None
    u = _unmapped(m, "model.layers.1.self_attn.o_proj")
    assert u is not None and u.status == "explained" and "in another order" in u.reason
    # the block computing with it still pairs: its output does not depend on how it lays its weights out
    assert m.pair("model.layers.1.self_attn") is not None
    assert m.pair("model.layers.0.self_attn.o_proj") is not None


def test_a_residual_one_side_adds_inside_the_block_is_subtracted_from_that_side():
    """HF's BLOOM MLP returns dropout_add(out, residual), vLLM's returns out (the decoder layer adds it): the
    observation says which input was added; the pair subtracts it from the reference, and only where the engine's
    class returns its last child's output."""
    target, reference = vllm_tree(), hf_tree()
    for tree, adds in ((target, -1), (reference, 1)):
        for i in range(N_LAYERS):
            tree.modules[f"model.layers.{i}.mlp"].adds_input = adds
    target.modules["model.layers.1.mlp"].adds_input = None       # a bug after the last child: still compared
    m = map_components(target, reference)
    for i in range(N_LAYERS):
        p = m.pair(f"model.layers.{i}.mlp")
        assert p.reference.minus_input == 1 and p.target.minus_input is None
        assert "adds its input #1" in p.rule
    for tree in (target, reference):                           # both add it: nothing subtracted
        for i in range(N_LAYERS):
            tree.modules[f"model.layers.{i}.mlp"].adds_input = 1
    assert map_components(target, reference).pair("model.layers.0.mlp").reference.minus_input is None
