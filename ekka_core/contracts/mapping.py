"""The component mapping as an artefact: target ↔ reference pairs and the components left unmapped, with why.

Written by the mapping stage (:mod:`ekka_core.mapping`) and the mapping agent, read by alignment; saved as
``mapping.json`` (schema ``ekka.mapping/1``), editable by hand and loaded back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

SCHEMA = "ekka.mapping/1"


@dataclass
class Endpoint:
    modules: list[str]
    port: str = "output"          # "output" | "input"
    select: str = "first"         # "first" | "stream" (sum of hidden + residual) | "all" (features of every
                                  # float output, concatenated) | "named:<key>"
    scale: float | None = None    # multiply by a constant the other side folds into its own module
    split_sizes: list[int] | None = None   # for 1:N, each reference module's width (GQA: q and kv differ)
    minus_input: int | None = None        # subtract the module's float input #k from its output: the residual one
                                          # side adds inside the block and the other outside (HF's BLOOM MLP)


@dataclass
class ComponentPair:
    component: str                # the target module path: what the report names
    relation: str                 # "1:1" | "1:N" | "N:1" | "shared"
    rule: str
    target: Endpoint
    reference: Endpoint
    rows: str = "tokens"          # "tokens" | "sampled"
    compare_inputs: bool = False  # inputs are comparable too (1:1 same kind): enables local blame on inputs
    input_select: str = "first"   # "stream" where the engine passes (hidden, residual) into the module
    aligner: str | None = None    # source of a validated custom aligner (ekka_core.align.template), run sandboxed


# Why a component is unmapped, as a state (the ``reason`` is the human explanation that goes with it).
NO_RULE = "no-rule"                   # no mapping rule applies: open for the knowledge base and the agent
RULES_OFF = "rules-off"               # the rules were disabled (EKKA_MAPPING_RULES=off): open, as no-rule
EXPLAINED = "explained"               # a rule says why it has no reference counterpart (model root, sampler, …)
AGENT_EXPLAINED = "agent-explained"   # the agent (or its knowledge base) says why it has no counterpart
AGENT_MAPPED = "agent-mapped"         # compared as part of a pair the agent mapped (the parts of an N:1 pair)
UNCHECKED = "unchecked"               # left open: the agent could not map it (no API key, budget, gave up, …)
STATUSES = (NO_RULE, RULES_OFF, EXPLAINED, AGENT_EXPLAINED, AGENT_MAPPED, UNCHECKED)
OPEN_STATUSES = (NO_RULE, RULES_OFF)  # what the agent is asked to map or explain, and what validate() refuses


def status_from_reason(reason: str) -> str:
    """The status of an ``Unmapped`` entry of a mapping.json written before statuses existed (its reason's
    wording was the status then)."""
    if reason.startswith("no rule: the mapping rules are disabled"):
        return RULES_OFF
    for prefix, status in (("no rule", NO_RULE), ("unchecked", UNCHECKED), ("agent:", AGENT_EXPLAINED),
                           ("knowledge base:", AGENT_EXPLAINED), ("compared as part of", AGENT_MAPPED)):
        if reason.startswith(prefix):
            return status
    return EXPLAINED


@dataclass
class Unmapped:
    module: str
    cls: str
    reason: str
    status: str                       # one of STATUSES

    @property
    def open(self) -> bool:
        """Neither mapped nor explained yet: the knowledge base and the agent may map it."""
        return self.status in OPEN_STATUSES

    @staticmethod
    def from_json(d: dict) -> "Unmapped":
        d = dict(d)
        d.setdefault("status", status_from_reason(str(d.get("reason", ""))))
        return Unmapped(**d)


@dataclass
class Mapping:
    target_framework: str
    reference_framework: str
    pairs: list[ComponentPair] = field(default_factory=list)
    unmapped: list[Unmapped] = field(default_factory=list)
    schema: str = SCHEMA

    def pair(self, component: str) -> ComponentPair | None:
        return next((p for p in self.pairs if p.component == component), None)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(path: Path) -> "Mapping":
        d = json.loads(Path(path).read_text())
        pairs = [ComponentPair(**{**p, "target": Endpoint(**p["target"]), "reference": Endpoint(**p["reference"])})
                 for p in d["pairs"]]
        return Mapping(d["target_framework"], d["reference_framework"], pairs,
                       [Unmapped.from_json(u) for u in d["unmapped"]], d.get("schema", SCHEMA))

    def validate(self, target_modules: Iterable[str]) -> list[str]:
        """Every module the target ran must be mapped or explained. Returns the problems (empty = complete)."""
        covered = {p.component for p in self.pairs} | {u.module for u in self.unmapped}
        problems = [f"{m}: neither mapped nor explained" for m in target_modules if m not in covered]
        problems += [f"{u.module}: unmapped ({u.reason})" for u in self.unmapped if u.open]
        return problems
