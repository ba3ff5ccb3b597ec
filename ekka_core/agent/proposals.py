"""What the agent (or the knowledge base) proposes, and the validator that accepts or rejects it.

A :class:`Proposal` maps one target component — or every component matching a pattern with ``{i}`` standing for a
layer index, ``model.layers.{i}.mlp.fancy_proj`` ↔ ``model.layers.{i}.mlp.dense_h_to_4h`` — to reference modules.
An :class:`Explanation` says why a component has no reference counterpart. The :class:`Validator` checks both
against the trees (and the traces when given) and confirms what passes; a component counts as done only once
confirmed. The checks:

* the component is one the rules left open (``Unmapped.open``: the agent never touches rule-made pairs);
* every named module exists in its tree; relation, port and select are well-formed and agree with the modules;
* ``split_sizes``: one per reference module, each the reference module's width when known, summing to the
  target's width when known (from the traces' rows, else the tree's ``out_features``);
* with traces: a ``scale`` gives the target the reference's magnitude (within :data:`SCALE_MAGNITUDE`);
* with traces: the pair aligns as the align stage would align it (same rows, same shape) — unless an aligner
  proposed for the component passed the sandbox's self-checks;
* an explanation is a real reason (a sentence, not a status word such as "no rule" or "unchecked");
* completeness: every component asked about is confirmed or explained.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from ekka_core.mapping import ComponentPair, Endpoint, Unmapped
from ekka_core.tree import ModelTree

RELATIONS = ("1:1", "1:N", "N:1", "shared")
# Words that name a mapping status rather than give a reason: an explanation starting with one says nothing (the
# status itself is Unmapped.status, never read from a reason's wording).
STATUS_WORDS = ("no rule", "unchecked")
PORTS = ("output", "input")
SELECTS = ("first", "stream", "all")
LAYER = "{i}"
# The scaled target's magnitude must be within this factor of the reference's (see Validator._check_scale).
SCALE_MAGNITUDE = 1.25


def valid_select(s: str) -> bool:
    return s in SELECTS or (s.startswith("named:") and len(s) > 6)


@dataclass
class Proposal:
    target: str                               # module path or pattern with {i}
    reference: list[str]                      # reference module paths (same {i})
    relation: str = "1:1"
    port: str = "output"                      # reference endpoint's port
    select: str = "first"                     # reference endpoint's select
    target_select: str = "first"
    split_sizes: list[int] | None = None
    scale: float | None = None                # multiplies the target side
    target_modules: list[str] | None = None   # N:1: all target modules (the component first)
    reason: str = ""
    target_class: str | None = None
    origin: str = "agent"
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "target_class": self.target_class, "relation": self.relation,
                "reference": self.reference, "port": self.port, "select": self.select,
                "target_select": self.target_select, "split_sizes": self.split_sizes, "scale": self.scale,
                "target_modules": self.target_modules, "reason": self.reason}

    @staticmethod
    def from_json(d: dict[str, Any], origin: str) -> "Proposal":
        return Proposal(target=str(d["target"]), reference=[str(r) for r in d["reference"]],
                        relation=d.get("relation", "1:1"), port=d.get("port", "output"),
                        select=d.get("select", "first"), target_select=d.get("target_select", "first"),
                        split_sizes=d.get("split_sizes"), scale=d.get("scale"),
                        target_modules=d.get("target_modules"), reason=d.get("reason", ""),
                        target_class=d.get("target_class"), origin=origin)


@dataclass
class Explanation:
    target: str
    reason: str
    target_class: str | None = None
    origin: str = "agent"
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "target_class": self.target_class, "reason": self.reason}

    @staticmethod
    def from_json(d: dict[str, Any], origin: str) -> "Explanation":
        return Explanation(str(d["target"]), str(d["reason"]), d.get("target_class"), origin)


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """``{i}`` matches a non-negative integer; every ``{i}`` in one pattern is the same integer."""
    parts = pattern.split(LAYER)
    if len(parts) == 1:
        return re.compile(re.escape(pattern))
    body = re.escape(parts[0]) + r"(?P<i>\d+)" + re.escape(parts[1])
    body += "".join(r"(?P=i)" + re.escape(p) for p in parts[2:])
    return re.compile(body)


def match(pattern: str, name: str) -> str | None:
    """The ``{i}`` value when ``name`` matches ``pattern`` ("" for an exact match), else None."""
    if LAYER not in pattern:
        return "" if pattern == name else None
    m = pattern_regex(pattern).fullmatch(name)
    return m.group("i") if m else None


def instantiate(pattern: str, i: str) -> str:
    return pattern.replace(LAYER, i) if i else pattern


@dataclass
class Verdict:
    confirmed: dict[str, tuple[ComponentPair, Proposal]] = field(default_factory=dict)
    explained: dict[str, Explanation] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)      # everything wrong, one line each
    rejected: dict[str, list[str]] = field(default_factory=dict)   # component -> its problems


class Validator:
    def __init__(self, target: ModelTree, reference: ModelTree, open_components: dict[str, Unmapped],
                 traces: Any = None, tolerance: float = 0.05):
        self.target, self.reference = target, reference
        self.tolerance = tolerance
        self.open = open_components
        self.traces = traces
        self.aligned: set[str] = set()            # components with an aligner that passed its self-checks
        self._width_cache: dict[tuple[str, str], int | None] = {}

    # ---- resolving proposals to components
    def covers(self, target: str, target_class: str | None = None) -> list[tuple[str, str]]:
        """Open components ``target`` (path or pattern) names, with their {i} value; the class must agree when
        recorded (a knowledge-base entry made for another class does not apply)."""
        out = []
        for comp in self.open:
            i = match(target, comp)
            if i is None:
                continue
            if target_class and self.open[comp].cls != target_class:
                continue
            out.append((comp, i))
        return out

    def pair_for(self, p: Proposal, comp: str, i: str) -> ComponentPair:
        refs = [instantiate(r, i) for r in p.reference]
        targets = [instantiate(t, i) for t in p.target_modules] if p.target_modules else [comp]
        if comp not in targets:
            targets = [comp, *targets]
        sizes = list(p.split_sizes) if p.split_sizes else None
        if p.relation == "1:N" and sizes is None and p.port == "output" and p.select == "first":
            widths = [self.reference.modules[r].out_features if r in self.reference.modules else None for r in refs]
            if all(w for w in widths):
                sizes = widths  # type: ignore[assignment]
        rule = f"agent ({p.origin}): {p.reason}".strip()
        stream = p.target_select == "stream"
        return ComponentPair(comp, p.relation, rule,
                             Endpoint(targets, select=p.target_select, scale=p.scale),
                             Endpoint(refs, port=p.port, select=p.select, split_sizes=sizes),
                             input_select="stream" if stream else "first")

    # ---- checks
    def check_pair(self, pair: ComponentPair) -> list[str]:
        probs: list[str] = []
        comp, ref = pair.component, pair.reference
        for m in pair.target.modules:
            if m not in self.target.modules:
                probs.append(f"target module {m!r} is not in the {self.target.framework} tree"
                             f"{self._near(m, self.target)}")
        for m in ref.modules:
            if m not in self.reference.modules:
                probs.append(f"reference module {m!r} is not in the {self.reference.framework} tree"
                             f"{self._near(m, self.reference)}")
        if pair.relation not in RELATIONS:
            probs.append(f"relation {pair.relation!r} is not one of {', '.join(RELATIONS)}")
        n_t, n_r = len(pair.target.modules), len(ref.modules)
        if pair.relation in ("1:1", "shared") and (n_r != 1 or n_t != 1):
            probs.append(f"relation {pair.relation} needs exactly one target and one reference module, got "
                         f"{n_t} and {n_r}")
        if pair.relation == "1:N" and (n_r < 2 or n_t != 1):
            probs.append(f"relation 1:N needs one target and at least two reference modules, got {n_t} and {n_r}")
        if pair.relation == "N:1" and (n_t < 2 or n_r != 1):
            probs.append(f"relation N:1 needs target_modules with at least two modules and one reference module, "
                         f"got {n_t} and {n_r}")
        if ref.port not in PORTS:
            probs.append(f"port {ref.port!r} is not one of {', '.join(PORTS)}")
        if not valid_select(ref.select) or not valid_select(pair.target.select):
            probs.append(f"select must be one of {', '.join(SELECTS)} or 'named:<key>' "
                         f"(got reference {ref.select!r}, target {pair.target.select!r})")
        if pair.target.scale is not None and not (isinstance(pair.target.scale, (int, float))
                                                  and pair.target.scale != 0):
            probs.append(f"scale must be a non-zero number, got {pair.target.scale!r}")
        if probs:
            return probs
        sizes = ref.split_sizes
        if sizes is not None:
            if len(sizes) != n_r or not all(isinstance(s, int) and s > 0 for s in sizes):
                probs.append(f"split_sizes {sizes} must hold one positive integer per reference module ({n_r})")
            else:
                for m, s in zip(ref.modules, sizes):
                    w = self.width("reference", m, ref.port, ref.select)
                    if w is not None and w != s:
                        probs.append(f"split_sizes gives {m} width {s}, but its {ref.port} is {w} wide")
                tw = self.width("target", comp, "output", pair.target.select) if n_t == 1 else None
                if tw is not None and sum(sizes) != tw:
                    probs.append(f"split_sizes {sizes} sum to {sum(sizes)}, but the target {comp} is {tw} wide")
        elif pair.relation == "1:N":
            probs.append("relation 1:N needs split_sizes (each reference module's width) when the reference "
                         "widths are not known from the tree")
        if probs or self.traces is None or comp in self.aligned:
            return probs
        try:
            aligned = self._align(pair)
        except Exception as e:                       # AlignmentError, or shapes the gatherer cannot read
            return [f"the pair does not align as declared: {e}"]
        if aligned is not None and pair.target.scale is not None:
            probs = self._check_scale(pair, aligned)
        if not probs and pair.relation == "1:N" and hasattr(self.traces, "reference"):
            try:
                from ekka_core.agent.tensors import order_problem
                problem = order_problem(self.traces.target, self.traces.reference, pair, self.tolerance)
            except Exception:
                problem = None
            if problem:
                probs.append(problem)
        return probs

    @staticmethod
    def _check_scale(pair: ComponentPair, aligned: Any) -> list[str]:
        """A ``scale`` is a constant the other side folds into its own module: the scaled target must have the
        reference's magnitude. Such constants depend on the model's configuration (Gemma's sqrt(hidden_size)
        embedding normaliser), so a knowledge-base entry made on another size must not pass."""
        ratio = float(aligned.target.norm() / aligned.reference.norm().clamp_min(1e-30))
        if 1 / SCALE_MAGNITUDE <= ratio <= SCALE_MAGNITUDE:
            return []
        return [f"scale {pair.target.scale:g} makes the target {ratio:.3g}× the reference's magnitude; a scale of "
                f"about {pair.target.scale / ratio:.3g} would match (such a constant depends on the model's "
                "configuration)"]

    def _align(self, pair: ComponentPair) -> Any:
        """The pair aligned as the align stage would (None without all three traces)."""
        traces = self.traces
        if not all(hasattr(traces, a) for a in ("target", "reference", "reference_fp32")):
            return None
        from ekka_core.align import align_pair
        return align_pair(pair, traces)

    def width(self, side: str, module: str, port: str, select: str) -> int | None:
        """Row width of an endpoint: from the traces when given (exact), else the tree's out_features (output,
        select first only)."""
        key = (side, f"{module}|{port}|{select}")
        if key in self._width_cache:
            return self._width_cache[key]
        w: int | None = None
        trace = getattr(self.traces, side, None) if self.traces is not None else None
        if trace is not None:
            try:
                from ekka_core.agent.tensors import endpoint_rows
                got = endpoint_rows(trace, module, port, select)
                w = int(got[1].shape[1]) if got is not None else None
            except Exception:
                w = None
        if w is None and port == "output" and select == "first":
            tree = self.target if side == "target" else self.reference
            node = tree.modules.get(module)
            w = node.out_features if node is not None else None
        self._width_cache[key] = w
        return w

    @staticmethod
    def check_explanation(e: Explanation) -> list[str]:
        r = e.reason.strip()
        if len(r) < 8:
            return ["an explanation needs a real reason (a sentence saying why there is no reference counterpart)"]
        if r.lower().startswith(STATUS_WORDS):
            return [f"an explanation may not start with {' or '.join(map(repr, STATUS_WORDS))}: say why the "
                    "component has no reference counterpart"]
        return []

    # ---- one validator round
    def run(self, proposals: list[Proposal], explanations: list[Explanation],
            keep: Verdict | None = None) -> Verdict:
        """Resolve every open component to its latest proposal or explanation (a newer one replaces an older one,
        pattern or not), check it, and report what is still missing. ``keep``: components confirmed in an earlier
        round stay
        confirmed unless a newer proposal replaces them."""
        v = Verdict()
        chosen: dict[str, tuple[int, Any, str]] = {}     # comp -> (seq, item, i): the latest item wins
        for item in [*proposals, *explanations]:
            target_class = item.target_class if item.origin != "agent" else None
            for comp, i in self.covers(item.target, target_class):
                if comp not in chosen or item.seq >= chosen[comp][0]:
                    chosen[comp] = (item.seq, item, i)
        pending = []
        for comp in self.open:
            if comp not in chosen:
                if keep and comp in keep.confirmed:
                    v.confirmed[comp] = keep.confirmed[comp]
                elif keep and comp in keep.explained:
                    v.explained[comp] = keep.explained[comp]
                else:
                    pending.append(comp)
                continue
            _, item, i = chosen[comp]
            if isinstance(item, Explanation):
                probs = self.check_explanation(item)
                if not probs:
                    v.explained[comp] = item
            else:
                pair = self.pair_for(item, comp, i)
                probs = self.check_pair(pair)
                if not probs:
                    v.confirmed[comp] = (pair, item)
            if probs:
                v.rejected[comp] = probs
                v.problems += [f"{comp}: {p}" for p in probs]
        # N:1: the other target modules of a confirmed pair are compared through it
        part_of = {m for pair, _ in v.confirmed.values() for m in pair.target.modules[1:]}
        v.problems += [f"{comp} ({self.open[comp].cls}): neither mapped nor explained"
                       for comp in pending if comp not in part_of]
        return v

    @staticmethod
    def _near(name: str, tree: ModelTree) -> str:
        near = difflib.get_close_matches(name, list(tree.modules), n=3, cutoff=0.6)
        return f" (close: {', '.join(near)})" if near else ""


def generalize(confirmed: dict[str, tuple[ComponentPair, Proposal]], open_components: dict[str, Unmapped]
               ) -> list[Proposal]:
    """Proposals to store in the knowledge base: patterns as proposed; exact proposals folded into one ``{i}``
    pattern when every open component of that pattern (same class) was confirmed with the same mapping."""
    out: dict[str, Proposal] = {}
    exact: dict[str, list[tuple[str, Proposal]]] = {}
    for comp, (_, p) in confirmed.items():
        cls = open_components[comp].cls if comp in open_components else p.target_class
        if LAYER in p.target:
            out.setdefault(p.target, _with_class(p, cls))
            continue
        g = _generalize_one(p)
        key = g.target if g is not None else p.target
        exact.setdefault(key, []).append((comp, _with_class(p, cls)))
    for key, items in exact.items():
        gens = [_generalize_one(p) for _, p in items]
        if key in out and all(g is not None and _sig(g) == _sig(out[key]) for g in gens):
            continue                                  # the stored pattern already says the same
        same = all(g is not None for g in gens) and len({_sig(g) for g in gens if g is not None}) == 1
        if same and gens[0] is not None:
            cls = items[0][1].target_class
            matching = [c for c, u in open_components.items() if match(key, c) is not None and u.cls == cls]
            if set(matching) <= {c for c, _ in items} and len(matching) > 1:
                out[key] = gens[0]
                continue
        for _, p in items:
            out[p.target] = p
    return list(out.values())


def _sig(p: Proposal) -> str:
    """What a proposal maps (its reason aside)."""
    return repr({k: v for k, v in p.to_json().items() if k != "reason"})


def _with_class(p: Proposal, cls: str | None) -> Proposal:
    q = Proposal(**{**p.__dict__})
    q.target_class = cls
    return q


_LAYER_SEGMENT = re.compile(r"\.(\d+)(?=\.|$)")


def _generalize_one(p: Proposal) -> Proposal | None:
    m = _LAYER_SEGMENT.search(p.target)
    if m is None:
        return None
    n = m.group(1)
    seg = re.compile(r"\." + n + r"(?=\.|$)")

    def sub(name: str) -> str | None:
        return seg.sub("." + LAYER, name, count=1) if seg.search(name) else None

    refs = [sub(r) for r in p.reference]
    tms = [sub(t) for t in p.target_modules] if p.target_modules else None
    if any(r is None for r in refs) or (tms is not None and any(t is None for t in tms)):
        return None
    q = Proposal(**{**p.__dict__})
    q.target = sub(p.target) or p.target
    q.reference = refs  # type: ignore[assignment]
    q.target_modules = tms  # type: ignore[assignment]
    return q
