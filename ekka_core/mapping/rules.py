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
6. ``same-weights`` — the reference module that computes with the same weights: the modules owning the parameters
                  each side's subtree uses (recorded by the tracer, however they are reached) are the same once the
                  engine's own declarations translate them (``hf_to_vllm_mapper``, ``packed_modules_mapping``,
                  parameters it stacks into an enclosing module such as a fused-MoE layer), and the outputs have
                  the same width — or, where the two name them differently (HF 5's converted checkpoints), the
                  same weights by value (Σw, Σw² of the bf16-rounded values, unchanged by concatenating, stacking,
                  transposing or padding). The module at the same path is tried first, then any reference module
                  computing with exactly those weights (a unique one). A parameter-free module (a plain activation) pairs with the
                  one at its place only when both consume and produce the same widths. The same values in another
                  order (Σ(i+j)·w differs: BLOOM's fused qkv, which vLLM regroups at load) are not a pair — the
                  output features come in another order. A block one side returns with its residual added inside
                  (HF's BLOOM attention and MLP) and the other without (its class returns its last weighted child's
                  output, observed on the trace: ``ModuleNode.adds_input``) is compared with that input subtracted.
7. ``unmapped`` with a reason — never silently dropped, never guessed. A module whose name matches but whose
                  computation does not (it also applies a weight the reference applies in its parent — vLLM's shared
                  expert multiplies by its sigmoid gate; it consumes ``[gate|up]`` where the reference's consumes
                  ``gate``) is unmapped with what differs: **a name match alone never makes a pair**.

Rules read a module by the name the engine registered it under (``ModuleNode.registered``): a shared expert that
vLLM's fused-MoE runner calls from inside ``experts`` is still the block's ``shared_expert``; the report names the
call site the hooks saw.

A mapping is a JSON artefact: save it, edit it, load it back (:func:`Mapping.load`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ekka_core.contracts.mapping import EXPLAINED, NO_RULE, RULES_OFF, ComponentPair, Endpoint, Mapping, Unmapped
from ekka_core.mapping.names import _to_target_name
from ekka_core.mapping.switch import RULES_OFF_REASON, rules_enabled
from ekka_core.tree import ModelTree, ModuleNode


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
    places = Places(target, reference)
    packed = places.packed
    normalizer = target.declared.get("embedding_normalizer")

    for name, node in target.modules.items():
        # A module object serving several call sites is read at its call site first (vLLM's one rotary_emb, called
        # by every layer), then by the name the engine registered it under (a shared expert the fused-MoE runner
        # calls from inside `experts` is still the block's `shared_expert`).
        places_of = [name] + ([node.registered] if node.registered and node.registered != name else [])
        leaf = name.rsplit(".", 1)[-1]
        cls = node.cls

        def ref(child: str) -> str | None:
            for place in places_of:
                parent = place.rsplit(".", 1)[0] if "." in place else ""
                found = places.ref_at.get(f"{parent}.{child}" if parent else child)
                if found:
                    return found
            return None

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
        # 3. attention core (kernel) ↔ what the reference feeds its attention's output projection: `o_proj`, or
        # (GPT-2's c_proj, Falcon's dense, OPT's out_proj) the last weighted child the reference attention calls,
        # consuming what the kernel produces
        # (a kernel holds no weights: GPT-2's attention *block* is also named `attn`)
        kernel = leaf == "attn" and not node.weights
        out_proj = (ref("o_proj") or places.output_projection(places_of, node)) if kernel else None
        if out_proj:
            mapping.pairs.append(ComponentPair(name, "1:1", f"attention-core ↔ input of {out_proj.rsplit('.', 1)[-1]}",
                                               Endpoint([name]), Endpoint([out_proj], port="input")))
            continue
        # 4. logits
        if cls == "LogitsProcessor" and "" in reference.modules:
            mapping.pairs.append(ComponentPair(name, "1:1", "logits ↔ reference final logits",
                                               Endpoint([name]), Endpoint([""], select="named:logits"),
                                               rows="sampled"))
            continue
        if leaf == "rotary_emb" and ref("apply_rotary_pos_emb"):
            mapping.pairs.append(ComponentPair(name, "1:1", "rotary ↔ reference apply_rotary_pos_emb (rotated q, k)",
                                               Endpoint([name], select="all"),
                                               Endpoint([ref("apply_rotary_pos_emb")], select="all")))  # type: ignore[list-item]
            continue
        if leaf == "rotary_emb" and not any(p in places.ref_at for p in places_of):
            mapping.unmapped.append(Unmapped(name, cls, "the reference applies rotary embeddings with a function "
                                                        "inside attention's forward; checked through attn",
                                             EXPLAINED))
            continue
        # 5. the reference module computing with the same weights: at the same place first, else anywhere (unique)
        r, why_not = places.counterpart(places_of, node)
        if r is not None:
            stream = _is_residual_stream(node.cls)
            scale = normalizer if (leaf == "embed_tokens" and normalizer and
                                   "Scaled" in reference.modules[r].cls) else None
            relation = "shared" if node.shared else "1:1"
            added = None if stream else places.residual_added_inside(node, reference.modules[r])
            side, k = added or ("", None)
            mapping.pairs.append(ComponentPair(
                name, relation, places.rule(node, r) + (" (engine applies the embedding normaliser in the parent's "
                                                        "forward)" if scale else "")
                + (f" ({'the reference' if side == 'reference' else 'the engine'} adds its input #{k}, the residual, "
                   "inside the block, the other side outside it: subtracted)" if added else ""),
                Endpoint([name], select="stream" if stream else "first", scale=scale,
                         minus_input=k if side == "target" else None),
                Endpoint([r], minus_input=k if side == "reference" else None),
                compare_inputs=not scale and leaf != "embed_tokens",
                input_select="stream" if stream or "Norm" in node.cls else "first"))
            continue
        if why_not:
            mapping.unmapped.append(Unmapped(name, cls, why_not, EXPLAINED))
            continue
        mapping.unmapped.append(Unmapped(name, cls, "no rule: no reference module at this path and none computing "
                                                    "with the same weights", NO_RULE))
    return mapping


class Places:
    """Where a target module's counterpart is: reference names translated by the engine's own declarations, and
    what each side's modules compute with (:attr:`ModuleNode.weights`)."""

    def __init__(self, target: ModelTree, reference: ModelTree):
        self.target, self.reference = target, reference
        self.packed: dict[str, list[str]] = target.declared.get("packed_modules_mapping", {})
        self.rename = target.declared.get("hf_to_vllm_mapper", {})
        self.ref_at = {_to_target_name(r, self.rename): r for r in reference.modules}   # target-style → reference
        self._fused_into = {part: fused for fused, parts in self.packed.items() for part in parts}
        root = target.modules.get("")
        self._target_owners = set(root.weights) if root is not None and root.weights else {
            o for n in target.modules.values() for o in (n.weights or [])}
        # Per reference module, once: its owners named as the target names them, and its weight sums — the
        # "anywhere" lookups by name and by value.
        self._translated = {r: None if n.weights is None else frozenset(self._as_target_owner(o) for o in n.weights)
                            for r, n in reference.modules.items()}
        self._sums = {r: reference.fingerprint(n) for r, n in reference.modules.items()}
        self._by_weights: dict[frozenset[str], list[str]] = {}
        self._class_adds: dict[tuple[int, str], set[int | None]] = {}
        for r, owners in self._translated.items():
            if owners:
                self._by_weights.setdefault(owners, []).append(r)

    def translated(self, rnode: ModuleNode) -> frozenset[str] | None:
        """The owners of a reference module's weights, named as the target names them (None: not recorded)."""
        return self._translated[rnode.name]

    def _as_target_owner(self, owner: str) -> str:
        name = _to_target_name(owner, self.rename)
        parent, _, leaf = name.rpartition(".")
        if leaf in self._fused_into:                      # q_proj → qkv_proj (packed_modules_mapping)
            name = f"{parent}.{self._fused_into[leaf]}" if parent else self._fused_into[leaf]
        if name in self._target_owners:
            return name
        # A parameter the engine stacks into an enclosing module's (vLLM's FusedMoE holds every expert's gate/up/down
        # as w13/w2): the nearest target owner enclosing it.
        enclosing = [o for o in self._target_owners if name.startswith(o + ".")]
        if enclosing:
            return max(enclosing, key=len)
        # The other way round: the engine keeps a parameter-holding module inside the one the reference has (vLLM's
        # MoE runner `experts` holds `routed_experts`); when exactly one target owner sits under it, that is it.
        inside = [o for o in self._target_owners if o.startswith(name + ".")]
        return inside[0] if len(inside) == 1 else name

    def counterpart(self, places_of: list[str], node: ModuleNode) -> tuple[str | None, str]:
        """(the reference module computing what ``node`` computes, or None; why the one at its place does not).
        ``places_of``: the module's names, call site first."""
        why = ""
        for place in places_of:
            r = self.ref_at.get(place)
            if r is None:
                continue
            why = self.differs(node, r)
            if not why:
                return r, ""
        owners = frozenset(node.weights or ())
        candidates = set(self._by_weights.get(owners, [])) if owners else set()
        ours = self.target.fingerprint(node)
        if ours is not None:
            candidates |= {r for r, theirs in self._sums.items() if _same_sums(ours, theirs)}
        found = sorted(c for c in candidates if not self.differs(node, c))
        if len(found) == 1:
            return found[0], ""
        if len(found) > 1:
            return None, (f"computes with the same weights as several reference modules ({_listed(found)}): "
                          f"which one computes what it does is not decided by its weights")
        return None, why

    def output_projection(self, places_of: list[str], node: ModuleNode) -> str | None:
        """The reference attention's output projection, by call order and width: of the reference module at the
        kernel's parent place, the weighted child called last, when it consumes the width the kernel produces."""
        for place in places_of:
            parent = place.rsplit(".", 1)[0] if "." in place else ""
            r_parent = self.ref_at.get(parent)
            if r_parent is None:
                continue
            children = [(n, c) for n, c in self.reference.modules.items()
                        if n.rsplit(".", 1)[0] == r_parent and n != r_parent and c.weights]
            if not children:
                continue
            last, child = max(children, key=lambda nc: nc[1].first_call)
            if node.out_features and child.in_features == node.out_features:
                return last
        return None

    def differs(self, node: ModuleNode, r: str) -> str:
        """Why ``node`` and reference module ``r`` do not compute the same function ("" when they do)."""
        rnode = self.reference.modules[r]
        ours, theirs = node.weights, self.translated(rnode)
        if ours is None or theirs is None:
            side = "engine's" if ours is None else "reference's"
            return (f"not provably the same computation as the reference's {r}: the {side} trace does not record "
                    f"which weights its modules use (traced by an older Ekka; re-run with --fresh)")
        extra, missing = sorted(set(ours) - theirs), sorted(theirs - set(ours))
        same_values = _same_sums(self.target.fingerprint(node), self._sums[r])
        if (extra or missing) and not same_values:
            words = []
            if extra:
                words.append(f"it also computes with {_listed(extra)}, which the reference applies outside {r}")
            if missing:
                words.append(f"the reference's {r} also computes with {_listed(missing)}")
            return (f"not the same computation as the reference's {r} (same place, other weights): "
                    f"{'; '.join(words)}; compared through the modules that own those weights")
        reordered = self._reordered(node, rnode)
        if reordered:
            return (f"not comparable feature by feature with the reference's {r}: the same weight values as its "
                    f"{reordered}, in another order — the engine lays them out differently when it loads them (BLOOM's "
                    "fused qkv is regrouped from per-head to [q|k|v]), so its output features come in another order; "
                    "compared through the modules that consume them")
        if node.out_features and rnode.out_features and node.out_features != rnode.out_features:
            return (f"not the same computation as the reference's {r}: it produces width {node.out_features}, the "
                    f"reference's {rnode.out_features}")
        if not ours:
            # Parameter-free: nothing ties the two but their place, so what they consume and produce must match.
            widths = (node.in_features, rnode.in_features, node.out_features, rnode.out_features)
            if None in widths:
                return (f"parameter-free and its widths were not observed on both sides: the reference's {r} "
                        f"cannot be shown to compute the same function")
            if self.target.tp_size == 1 and node.in_features != rnode.in_features:
                return (f"not the same function as the reference's {r}: it consumes width {node.in_features}, the "
                        f"reference's consumes {rnode.in_features} (a fused operand on one side)")
        return ""

    def residual_added_inside(self, node: ModuleNode, rnode: ModuleNode) -> tuple[str, int] | None:
        """("reference" | "target", k) where that side's module returns its last weighted child's output plus its
        input #k (the residual) and the other side's class returns its child's output alone: HF's BLOOM attention and
        MLP ``dropout_add`` the residual, vLLM's add it in the decoder layer. Read per class on the other side, so
        an instance whose output a bug changed after its last child is still compared (and found)."""
        for side, mine, other, tree in (("reference", rnode, node, self.target),
                                        ("target", node, rnode, self.reference)):
            k = mine.adds_input
            if k is not None and k >= 0 and other.adds_input != k and -1 in self._adds_by_class(tree, other.cls):
                return side, k
        return None

    def _adds_by_class(self, tree: ModelTree, cls: str) -> set[int | None]:
        key = (id(tree), cls)
        if key not in self._class_adds:
            self._class_adds[key] = {n.adds_input for n in tree.modules.values() if n.cls == cls}
        return self._class_adds[key]

    def _reordered(self, node: ModuleNode, rnode: ModuleNode) -> str | None:
        """The reference owner whose weights ``node`` computes with in another order (None: the same order, or not
        decidable). Decided only where one owner on each side holds the same parameters under the same name (a
        linear layer, a norm): a packed or stacked owner is laid out by the engine's own declaration."""
        if self.target.tp_size != 1 or self.reference.tp_size != 1:
            return None
        if not node.weights or len(node.weights) != 1 or not rnode.weights or len(rnode.weights) != 1:
            return None
        ours, theirs = node.weights[0], rnode.weights[0]
        if _to_target_name(theirs, self.rename) != ours:
            return None
        a, b = self.target.weight_sums.get(ours), self.reference.weight_sums.get(theirs)
        if not a or not b or len(a) < 4 or len(b) < 4 or not _same_sums(a, b):
            return None
        tolerance = 1e-4 * max(a[3], b[3]) * max(a[1], b[1]) ** 0.5
        return None if abs(a[2] - b[2]) <= tolerance else theirs

    def rule(self, node: ModuleNode, r: str) -> str:
        """The rule's words for a pair :meth:`counterpart` made."""
        at_place = r in (self.ref_at.get(node.name), self.ref_at.get(node.registered or node.name))
        if not node.weights:
            return "parameter-free, same place, same widths in and out"
        by_name = frozenset(node.weights) == self.translated(self.reference.modules[r])
        return ("same-weights" + ("" if at_place else " (at another path)") + ("" if by_name else " by value")
                + f" ({_listed(node.weights)})")


def _same_sums(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    """The same weights by value: (Σw, Σw²) of the bf16-rounded values agree to float64 summation-order error
    (loose enough for a parameter one side keeps in fp32 and rounds twice elsewhere; a different tensor of the same
    shape and init differs in Σw by about √Σw²)."""
    if a is None or b is None or not (a[1] > 0 and b[1] > 0):
        return False
    return abs(a[1] - b[1]) <= 1e-5 * max(a[1], b[1]) and abs(a[0] - b[0]) <= 1e-4 * max(a[1], b[1]) ** 0.5


def _listed(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _is_residual_stream(cls: str) -> bool:
    """vLLM decoder layers return (hidden, residual) whose sum is HF's single hidden stream."""
    return cls.endswith("DecoderLayer") or cls.endswith("Block")
