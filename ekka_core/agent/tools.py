"""The agent's tools: their JSON schemas (what the model sees) and their implementations (what runs here).

Every tool returns text. A failure is returned to the model as a ``tool_result`` with ``is_error: true``; a
*malformed* call (unknown tool, missing or mistyped arguments) is counted separately and ends the session after
``max_malformed`` of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ekka_core.agent.config import AgentConfig
from ekka_core.agent.proposals import (LAYER, RELATIONS, SELECTS, Explanation, Proposal, Validator, instantiate,
                                      match, valid_select)
from ekka_core.agent.source import SourceLookup
from ekka_core.agent.tensors import ToolError, infer_match, tensor_sum
from ekka_core.mapping import Unmapped
from ekka_core.tree import ModelTree

_FW = {"type": "string", "description": "'target' (the engine under test, e.g. vllm) or 'reference' (the trusted "
                                        "framework, e.g. hf); the framework's own name works too"}
_PORT = {"type": "string", "enum": ["output", "input"]}
# The two sides of a proposed correspondence, as infer_tensor_match and propose_mapping both take them.
_MODULE_PAIR = {"target_module": {"type": "string"},
                "reference_modules": {"type": "array", "items": {"type": "string"}, "minItems": 1}}

TOOLS: list[dict[str, Any]] = [
    {"name": "get_model_tree",
     "description": "The compressed Model Tree of one framework: every module that ran, in execution order, one "
                    "line each ('path  Class'), repeated layers folded as layers.[0-31].",
     "input_schema": {"type": "object", "properties": {"framework": _FW}, "required": ["framework"]}},
    {"name": "get_class_definition",
     "description": "The source code of a module class (read statically from the framework's files, never "
                    "imported). Use it when names are ambiguous: e.g. HF's RotaryEmbedding computes cos/sin while "
                    "vLLM's applies the rotation.",
     "input_schema": {"type": "object", "properties": {"framework": _FW, "class_name": {"type": "string"}},
                      "required": ["framework", "class_name"]}},
    {"name": "get_tensor_sum",
     "description": "Fingerprint of a module's traced tensors: shapes and dtypes of its first call, and per "
                    "(sequence, position) row sums, width, L2 norm of its output (or input) as the aligner would "
                    "gather it ('first' float tensor; 'stream' = sum of two same-shaped outputs, e.g. vLLM's "
                    "(hidden, residual); 'all' = features of every float tensor concatenated).",
     "input_schema": {"type": "object", "properties": {"framework": _FW, "module": {"type": "string"},
                                                       "port": _PORT},
                      "required": ["framework", "module"]}},
    {"name": "infer_tensor_match",
     "description": "Which arrangement of the reference modules' tensors matches the target module's: identity, "
                    "a constant scale, a concatenation of several reference modules (every order tried, with the "
                    "split sizes), a feature slice of either side, a permutation of features. Compares the "
                    "traced rows (relative L2 error, cosine); tries the reference's output and input unless "
                    "reference_port is given. Matching candidates include the exact propose_mapping arguments.",
     "input_schema": {"type": "object", "properties": {**_MODULE_PAIR, "target_port": _PORT, "reference_port": _PORT},
         "required": ["target_module", "reference_modules"]}},
    {"name": "propose_mapping",
     "description": "Propose what a target component computes in the reference. target_module may use '{i}' for "
                    "a layer index to cover every layer at once (model.layers.{i}.mlp.fancy_proj ↔ "
                    "model.layers.{i}.mlp.dense_h_to_4h). relation: '1:1'; '1:N' (the target's output is the "
                    "reference modules' outputs concatenated along features, in the order given, widths in "
                    "split_sizes); 'N:1' (target_modules together ↔ one reference module); 'shared' (one module "
                    "object reused across layers). port/select describe the reference side: port 'input' compares "
                    "with what the reference module receives (e.g. a fused activation ↔ the input of down_proj). "
                    "target_select 'stream' sums a (hidden, residual) pair. scale multiplies the target side. "
                    "The validator checks it when you call finish.",
     "input_schema": {"type": "object", "properties": {
         **_MODULE_PAIR,
         "relation": {"type": "string", "enum": list(RELATIONS)},
         "port": _PORT,
         "select": {"type": "string", "description": "first | stream | all | named:<key> (default first)"},
         "target_select": {"type": "string", "description": "first | stream | all (default first)"},
         "split_sizes": {"type": "array", "items": {"type": "integer"}},
         "scale": {"type": "number"},
         "target_modules": {"type": "array", "items": {"type": "string"}},
         "reason": {"type": "string", "description": "one sentence: the evidence (class source, tensor match)"}},
         "required": ["target_module", "reference_modules", "relation", "reason"]}},
    {"name": "explain_unmapped",
     "description": "Declare that a target component has no reference counterpart, with the reason (e.g. "
                    "sampling machinery, a kernel whose result the reference never materialises). It is then "
                    "reported as not compared. '{i}' patterns work as in propose_mapping.",
     "input_schema": {"type": "object", "properties": {"target_module": {"type": "string"},
                                                       "reason": {"type": "string"}},
                      "required": ["target_module", "reason"]}},
    {"name": "propose_aligner",
     "description": "Propose an aligner for a component whose tensors the built-in aligner cannot line up. "
                    "'source' must follow the fixed template (given in the first message): def align(target, "
                    "reference, meta) -> (target_rows, reference_rows), numpy and math only. It runs in a "
                    "sandbox on the traced tensors of one sequence — every call that computed it (prefill and "
                    "decode steps) stacked along the rows: target names out0/in0…, reference names out0/in0… "
                    "(m0.out0, m1.out0… for several reference modules), already cut to the same token positions; "
                    "meta has rows, positions, split_sizes, reference_modules. Self-check failures come back as "
                    "errors. Once the mapping validates, the align stage runs the same code on every sequence.",
     "input_schema": {"type": "object", "properties": {
         "target_module": {"type": "string"}, "source": {"type": "string"},
         "reference_modules": {"type": "array", "items": {"type": "string"},
                               "description": "default: those of your proposal for this component"}},
         "required": ["target_module", "source"]}},
    {"name": "finish",
     "description": "Call when every component you were asked about is proposed or explained. The validator "
                    "then checks everything; its problems come back for another round.",
     "input_schema": {"type": "object", "properties": {"summary": {"type": "string"}}}},
]
TOOL_NAMES = {t["name"] for t in TOOLS}

_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                       "boolean": (bool,), "object": (dict,), "array": (list,)}


def check_args(schema: dict[str, Any], args: Any) -> list[str]:
    """Problems with ``args`` against a tool's input schema (the subset the tools use)."""
    if not isinstance(args, dict):
        return [f"the input must be a JSON object, got {type(args).__name__}"]
    props = schema.get("properties", {})
    probs = [f"missing required argument {k!r}" for k in schema.get("required", []) if k not in args]
    for k, v in args.items():
        if k not in props:
            probs.append(f"unknown argument {k!r} (known: {', '.join(props) or 'none'})")
            continue
        probs += _check_value(k, props[k], v)
    return probs


def _check_value(name: str, spec: dict[str, Any], v: Any) -> list[str]:
    t = spec.get("type")
    ok = _TYPES.get(t, (object,))
    if isinstance(v, bool) and t in ("integer", "number"):
        return [f"argument {name!r} must be {t}, got a boolean"]
    if not isinstance(v, ok):
        return [f"argument {name!r} must be {t}, got {type(v).__name__} {json.dumps(v)[:60]}"]
    if "enum" in spec and v not in spec["enum"]:
        return [f"argument {name!r} must be one of {spec['enum']}, got {v!r}"]
    if t == "array":
        if len(v) < spec.get("minItems", 0):
            return [f"argument {name!r} needs at least {spec['minItems']} item(s)"]
        item = spec.get("items", {})
        for j, x in enumerate(v):
            sub = _check_value(f"{name}[{j}]", item, x)
            if sub:
                return sub
    return []


@dataclass
class ToolOutcome:
    content: str
    is_error: bool = False
    malformed: bool = False


@dataclass
class Toolbox:
    target: ModelTree
    reference: ModelTree
    open: dict[str, Unmapped]
    validator: Validator
    config: AgentConfig
    traces: Any = None
    proposals: list[Proposal] = field(default_factory=list)
    explanations: list[Explanation] = field(default_factory=list)
    aligners: dict[str, dict[str, Any]] = field(default_factory=dict)    # component -> {source, checks, ...}
    calls: int = 0
    errors: int = 0
    malformed: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    _seq: int = 0

    def __post_init__(self) -> None:
        self._sources = {"target": SourceLookup(self.target), "reference": SourceLookup(self.reference)}

    # ---- dispatch
    def call(self, name: str, args: Any) -> ToolOutcome:
        self.calls += 1
        if name not in TOOL_NAMES:
            out = ToolOutcome(f"unknown tool {name!r}; the tools are: {', '.join(sorted(TOOL_NAMES))}", True, True)
        else:
            schema = next(t["input_schema"] for t in TOOLS if t["name"] == name)
            probs = check_args(schema, args)
            if probs:
                out = ToolOutcome(f"malformed call to {name}: " + "; ".join(probs), True, True)
            else:
                try:
                    out = ToolOutcome(getattr(self, f"_t_{name}")(**args))
                except ToolError as e:
                    out = ToolOutcome(f"{name} failed: {e}", True)
                except Exception as e:                 # a tool bug must not end the diagnosis
                    out = ToolOutcome(f"{name} failed unexpectedly: {type(e).__name__}: {e}", True)
        if out.is_error:
            self.errors += 1
        if out.malformed:
            self.malformed += 1
        limit = self.config.max_tool_result_chars
        if len(out.content) > limit:
            out.content = out.content[:limit] + f"\n… [{len(out.content) - limit} more characters cut]"
        self.log.append({"tool": name, "error": out.is_error, "malformed": out.malformed})
        return out

    # ---- helpers
    def _tree(self, framework: str) -> tuple[str, ModelTree]:
        f = framework.strip().lower()
        if f in ("target", self.target.framework.lower()):
            return "target", self.target
        if f in ("reference", self.reference.framework.lower()):
            return "reference", self.reference
        raise ToolError(f"unknown framework {framework!r}: use 'target' ({self.target.framework}) or 'reference' "
                        f"({self.reference.framework})")

    def _trace(self, side: str) -> Any:
        if self.traces is None:
            raise ToolError("no traces were given to the agent: tensor tools are unavailable; use the trees, the "
                            "class sources and the widths in the first message")
        return getattr(self.traces, side)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _open_for(self, target: str) -> list[str]:
        covered = [c for c, _ in self.validator.covers(target)]
        if covered:
            return covered
        if LAYER not in target and target in self.target.modules:
            raise ToolError(f"{target} is not one of the components you were asked about (the rules already "
                            "handled it); only these are open: " + ", ".join(self.open))
        raise ToolError(f"{target!r} names none of the open components: " + ", ".join(self.open))

    # ---- tools
    def _t_get_model_tree(self, framework: str) -> str:
        side, tree = self._tree(framework)
        head = f"# {side}: {tree.framework} — {len(tree.modules)} modules, execution order\n"
        return head + tree.render()

    def _t_get_class_definition(self, framework: str, class_name: str) -> str:
        side, _ = self._tree(framework)
        return self._sources[side].class_source(class_name)

    def _t_get_tensor_sum(self, framework: str, module: str, port: str = "output") -> str:
        side, _ = self._tree(framework)
        return json.dumps(tensor_sum(self._trace(side), module, port, side))

    def _t_infer_tensor_match(self, target_module: str, reference_modules: list[str], target_port: str | None = None,
                              reference_port: str | None = None) -> str:
        res = infer_match(self._trace("target"), self._trace("reference"), target_module, reference_modules,
                          target_port=target_port, reference_port=reference_port, tol=self.config.match_tolerance)
        return json.dumps(res)

    def _t_propose_mapping(self, target_module: str, reference_modules: list[str], relation: str, reason: str,
                           port: str = "output", select: str = "first", target_select: str = "first",
                           split_sizes: list[int] | None = None, scale: float | None = None,
                           target_modules: list[str] | None = None) -> str:
        if not valid_select(select) or target_select not in SELECTS:
            raise ToolError(f"select must be one of {', '.join(SELECTS)} or 'named:<key>', target_select one of "
                            f"{', '.join(SELECTS)}")
        covered = self._open_for(target_module)
        p = Proposal(target_module, list(reference_modules), relation, port, select, target_select,
                     list(split_sizes) if split_sizes else None, scale, list(target_modules) if target_modules
                     else None, reason.strip(), origin="agent", seq=self._next())
        self.proposals.append(p)
        # An aligner was checked on the reference modules of its time: a proposal naming others retires it.
        dropped = []
        for comp, i in self.validator.covers(target_module):
            a = self.aligners.get(comp)
            if a is not None and a["reference"] != self.validator.pair_for(p, comp, i).reference.modules:
                del self.aligners[comp]
                self.validator.aligned.discard(comp)
                dropped.append(comp)
        # Early warnings: the validator decides at finish, but the model hears about problems now.
        warnings = []
        for comp, i in self.validator.covers(target_module)[:3]:
            warnings += [f"{comp}: {w}" for w in self.validator.check_pair(self.validator.pair_for(p, comp, i))]
        msg = f"recorded for {len(covered)} component(s): {', '.join(covered[:6])}{' …' if len(covered) > 6 else ''}"
        if dropped:
            msg += (f"\nthe aligner of {', '.join(dropped[:6])} was dropped: it was checked against other reference "
                    "modules (propose it again if it is still needed)")
        if warnings:
            msg += "\nthe validator will reject it as it stands:\n- " + "\n- ".join(warnings)
        else:
            msg += " (checks pass so far; final validation at finish)"
        return msg

    def _t_explain_unmapped(self, target_module: str, reason: str) -> str:
        covered = self._open_for(target_module)
        e = Explanation(target_module, reason.strip(), origin="agent", seq=self._next())
        probs = Validator.check_explanation(e)
        if probs:
            raise ToolError(probs[0])
        self.explanations.append(e)
        return f"recorded as unmapped: {', '.join(covered[:6])}{' …' if len(covered) > 6 else ''}"

    def _t_propose_aligner(self, target_module: str, source: str, reference_modules: list[str] | None = None) -> str:
        from ekka_core.align import AlignmentError
        from ekka_core.align.custom import aligner_inputs
        from ekka_core.align.sandbox import run_aligner

        covered = self._open_for(target_module)
        prop = next((p for p in reversed(self.proposals) if p.target == target_module
                     or any(c == covered[0] for c, _ in self.validator.covers(p.target))), None)
        if prop and reference_modules and list(reference_modules) != prop.reference:
            raise ToolError(f"reference_modules {reference_modules} differ from your proposal for this component "
                            f"({prop.reference}); propose_mapping with them first, or leave reference_modules out")
        patterns = list(reference_modules or (prop.reference if prop else []))
        if not patterns:
            raise ToolError("name reference_modules, or propose_mapping for this component first")
        # Reference modules of each covered component: the pattern's {i} is that component's layer.
        refs = {c: [instantiate(r, match(prop.target if prop else target_module, c) or "") for r in patterns]
                for c in covered}
        comp = covered[0]
        split_sizes = list(prop.split_sizes) if prop and prop.split_sizes else None
        try:
            inputs = aligner_inputs(self._trace("target"), self._trace("reference"), comp, refs[comp],
                                    split_sizes=split_sizes)
            res = run_aligner(source, inputs.target, inputs.reference, inputs.meta,
                              timeout_s=self.config.aligner_timeout_s)
        except AlignmentError as e:
            raise ToolError(f"the aligner was rejected: {e}") from None
        for c in covered:
            self.aligners[c] = {"target": target_module, "source": source, "reference": refs[c],
                                "reference_pattern": patterns, "checks": res.checks}
            self.validator.aligned.add(c)
        return (f"aligner accepted for {', '.join(covered[:6])}: result {list(res.target.shape)} on sequence "
                f"{inputs.meta['sequence']} ({inputs.meta['rows']} rows), self-checks {res.checks} "
                f"({res.seconds:.2f} s)")

    def _t_finish(self, summary: str = "") -> str:          # handled by the session (validator round)
        return "finish"
