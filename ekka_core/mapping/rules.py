"""The mapping stage's rules: which target module computes what which reference module(s) compute.

:func:`map_components` tries these rules in order for every module the target ran:

1. ``packed``   — the engine's own ``packed_modules_mapping`` (vLLM ``qkv_proj`` ← HF ``q_proj, k_proj, v_proj``):
                  one target module ↔ N reference modules, outputs concatenated along features (1:N).
2. ``gated-activation`` — a fused ``*AndMul`` activation (``act(gate) * up``) ↔ the input of the reference's
                  ``down_proj``: HF computes the product in the MLP's forward, not in a module.
3. ``rotary``   — the engine's rotary module (rotated q, k) ↔ the reference's ``apply_rotary_pos_emb`` call,
                  traced as a pseudo-module under the attention that calls it.
4. ``attention-core`` — the engine's attention kernel module (``attn``) ↔ the input of the reference ``o_proj``.
5. ``logits``   — the engine's ``logits_processor`` ↔ the reference model's final ``logits`` (soft-capping and
                  scaling included), at the positions the engine sampled.
6. ``same-path`` — a module at the same dotted path in the reference (after the engine's ``hf_to_vllm_mapper``):
                  the checkpoint tensors both load are the same, so are the components (1:1).
7. ``unmapped`` with a reason — never silently dropped, never guessed.

A mapping is a JSON artefact: save it, edit it, load it back (:func:`Mapping.load`).
"""

from __future__ import annotations

from ekka_core.contracts.mapping import EXPLAINED, NO_RULE, RULES_OFF, ComponentPair, Endpoint, Mapping, Unmapped
from ekka_core.mapping.names import _to_target_name
from ekka_core.mapping.switch import RULES_OFF_REASON, rules_enabled
from ekka_core.tree import ModelTree


# Classes whose output is not an activation of the model (sampling machinery) or has no reference counterpart.
_NOT_COMPARABLE = {
    "Sampler": "post-logits sampling: per-module activation comparison cannot see it",
}


# SGLang ≥ 0.5 keeps the residual stream outside its decoder layers (the layers' attn/ffn "boundaries" carry it
# in the forward batch): a layer returns its MLP's contribution, not the hidden state HF's layer returns. Comparing
# the two would report every layer as divergent; the layer's parts (attention, MLP, norms) are compared instead.
SGLANG_LAYER_REASON = ("SGLang keeps the residual stream outside the decoder layer: its output is the MLP's "
                       "contribution, not HF's hidden state; compared through its attention, MLP and norms")


def map_components(target: ModelTree, reference: ModelTree, *, rules: bool | None = None) -> Mapping:
    """Map every module the target ran. ``rules`` None: on unless ``EKKA_MAPPING_RULES=off`` (see above)."""
    mapping = Mapping(target.framework, reference.framework)
    if not (rules_enabled() if rules is None else rules):
        mapping.unmapped = [Unmapped(name, node.cls, RULES_OFF_REASON, RULES_OFF) for name, node in target.modules.items()]
        return mapping
    packed: dict[str, list[str]] = target.declared.get("packed_modules_mapping", {})
    rename = target.declared.get("hf_to_vllm_mapper", {})
    ref_modules = reference.modules
    ref_path = {_to_target_name(r, rename): r for r in ref_modules}  # target-style name -> reference name
    normalizer = target.declared.get("embedding_normalizer")

    for name, node in target.modules.items():
        leaf = name.rsplit(".", 1)[-1]
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        cls = node.cls

        def ref(child: str) -> str | None:
            return ref_path.get(f"{parent}.{child}" if parent else child)

        if name == "":
            mapping.unmapped.append(Unmapped(name, cls, "model root: the engine returns hidden states, the "
                                                        "reference logits; both are compared piecewise", EXPLAINED))
            continue
        if cls in _NOT_COMPARABLE:
            mapping.unmapped.append(Unmapped(name, cls, _NOT_COMPARABLE[cls], EXPLAINED))
            continue
        if target.framework == "sglang" and cls.endswith("DecoderLayer"):
            mapping.unmapped.append(Unmapped(name, cls, SGLANG_LAYER_REASON, EXPLAINED))
            continue
        # 1. packed (fused) modules, from the engine's declaration
        if leaf in packed and all(ref(p) for p in packed[leaf]):
            parts = [ref(p) for p in packed[leaf]]
            widths = [reference.modules[p].out_features for p in parts]  # type: ignore[index]
            mapping.pairs.append(ComponentPair(name, "1:N", f"packed_modules_mapping[{leaf!r}]",
                                               Endpoint([name]), Endpoint(parts, split_sizes=widths)))  # type: ignore[arg-type]
            continue
        # 2. gated activation: act(gate) * up, which HF computes inside the MLP's forward
        if cls.endswith("AndMul") and ref("down_proj"):
            mapping.pairs.append(ComponentPair(name, "1:1", "gated-activation ↔ input of down_proj",
                                               Endpoint([name]), Endpoint([ref("down_proj")], port="input")))  # type: ignore[list-item]
            continue
        # 3. attention core (kernel) ↔ what the reference feeds o_proj
        if leaf == "attn" and ref("o_proj"):
            mapping.pairs.append(ComponentPair(name, "1:1", "attention-core ↔ input of o_proj",
                                               Endpoint([name]), Endpoint([ref("o_proj")], port="input")))  # type: ignore[list-item]
            continue
        # 4. logits
        if cls == "LogitsProcessor" and "" in ref_modules:
            mapping.pairs.append(ComponentPair(name, "1:1", "logits ↔ reference final logits",
                                               Endpoint([name]), Endpoint([""], select="named:logits"),
                                               rows="sampled"))
            continue
        if leaf == "rotary_emb" and ref("apply_rotary_pos_emb"):
            mapping.pairs.append(ComponentPair(name, "1:1", "rotary ↔ reference apply_rotary_pos_emb (rotated q, k)",
                                               Endpoint([name], select="all"),
                                               Endpoint([ref("apply_rotary_pos_emb")], select="all")))  # type: ignore[list-item]
            continue
        if leaf == "rotary_emb" and name not in ref_path:
            mapping.unmapped.append(Unmapped(name, cls, "the reference applies rotary embeddings with a function "
                                                        "inside attention's forward; checked through attn",
                                             EXPLAINED))
            continue
        # 5. same path (a shared module may be called from a parent other than the one it is registered under:
        # vLLM's MoE runner calls the block's router `gate`; its checkpoint name is the registered one)
        same = name if name in ref_path else node.registered if node.registered in ref_path else None
        if same is not None:
            r = ref_path[same]
            stream = _is_residual_stream(node.cls)
            scale = normalizer if (leaf == "embed_tokens" and normalizer and
                                   "Scaled" in reference.modules[r].cls) else None
            relation = "shared" if node.shared else "1:1"
            mapping.pairs.append(ComponentPair(
                name, relation, "same-path" + (" (engine applies the embedding normaliser in the parent's "
                                               "forward)" if scale else ""),
                Endpoint([name], select="stream" if stream else "first", scale=scale),
                Endpoint([r]), compare_inputs=not scale and leaf != "embed_tokens",
                input_select="stream" if stream or "Norm" in node.cls else "first"))
            continue
        mapping.unmapped.append(Unmapped(name, cls, "no rule: no reference module at this path and no "
                                                    "declared weight mapping", NO_RULE))
    return mapping


def _is_residual_stream(cls: str) -> bool:
    """vLLM decoder layers return (hidden, residual) whose sum is HF's single hidden stream."""
    return cls.endswith("DecoderLayer") or cls.endswith("Block")
