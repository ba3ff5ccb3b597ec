"""The knowledge base: validated agent results, reused on the next run at $0 before any API call.

One JSON file per key ``(target framework, its version major.minor, reference framework, its version
major.minor, target model class, reference model class)`` — the model classes are the Model Trees' root modules
(``LlamaForCausalLM``). File name::

    <target_fw>-<target_mm>__<reference_fw>-<reference_mm>__<TargetClass>__<ReferenceClass>.json

A version of ``any`` matches every version (the shipped entries use it where the module layout is stable).

Format (``schema`` ``ekka.knowledge/1``)::

    {"schema": "ekka.knowledge/1",
     "key": {"target_framework": "vllm", "target_version": "0.32", "reference_framework": "hf",
             "reference_version": "5.19", "target_class": "…ForCausalLM", "reference_class": "…ForCausalLM"},
     "mappings": [{"target": "model.layers.{i}.mlp.fancy_proj", "target_class": "WeirdLinear",
                   "relation": "1:1", "reference": ["model.layers.{i}.mlp.dense_h_to_4h"],
                   "port": "output", "select": "first", "target_select": "first",
                   "split_sizes": null, "scale": null, "target_modules": null, "reason": "…",
                   "validated": {"by": "agent", "model": "claude-sonnet-5-5", "at": "2026-11-29T…Z"}}],
     "unmapped": [{"target": "…", "target_class": "…", "reason": "…", "validated": {…}}],
     "aligners": [{"target": "…", "source": "<aligner source>", "checks": {"shape": true, …}, "validated": {…}}]}

``{i}`` in a path stands for one layer index (the same in target and reference paths). An entry applies to a
component only when its path matches and the component's class equals ``target_class``; it is then validated
against this run's trees (and traces) exactly like a fresh agent proposal — a stale entry is skipped, shown to the
agent as a hint, and replaced when the agent's new result validates.

Read order: the user's directory (``$EKKA_KNOWLEDGE_DIR`` or ``~/.cache/ekka/knowledge``, written after every
validated agent run), then the entries shipped in ``ekka_core/agent/knowledge/``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from ekka_core.agent.proposals import Explanation, Proposal

SCHEMA = "ekka.knowledge/1"
SHIPPED_DIR = Path(__file__).resolve().parent / "knowledge"
ANY = "any"


@dataclass(frozen=True)
class KBKey:
    target_framework: str
    target_version: str
    reference_framework: str
    reference_version: str
    target_class: str
    reference_class: str

    def filename(self) -> str:
        parts = [f"{self.target_framework}-{self.target_version}", f"{self.reference_framework}-"
                 f"{self.reference_version}", self.target_class, self.reference_class]
        return "__".join(re.sub(r"[^A-Za-z0-9_.-]", "_", p) for p in parts) + ".json"

    def matches(self, other: dict[str, Any]) -> bool:
        """``other`` (a file's key) applies to this key: same frameworks and classes, versions equal or ``any``."""
        try:
            return (other["target_framework"] == self.target_framework
                    and other["reference_framework"] == self.reference_framework
                    and other["target_class"] == self.target_class
                    and other["reference_class"] == self.reference_class
                    and other["target_version"] in (self.target_version, ANY)
                    and other["reference_version"] in (self.reference_version, ANY))
        except (KeyError, TypeError):
            return False


def major_minor(version: str | None) -> str:
    if not version:
        return "unknown"
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else re.sub(r"[^A-Za-z0-9.]", "_", version)[:20]


@dataclass
class KBEntry:
    path: Path
    key: dict[str, Any]
    mappings: list[Proposal]
    unmapped: list[Explanation]
    aligners: list[dict[str, Any]]
    shipped: bool

    @property
    def exact(self) -> bool:
        return ANY not in (self.key.get("target_version"), self.key.get("reference_version"))


class KnowledgeBase:
    def __init__(self, user_dir: Path | None, *, shipped: bool = True, shipped_dir: Path = SHIPPED_DIR):
        self.user_dir = Path(user_dir) if user_dir is not None else None
        self.dirs = [d for d in ([self.user_dir] if self.user_dir else []) + ([shipped_dir] if shipped else [])]
        self.shipped_dir = shipped_dir
        self.errors: list[str] = []           # unreadable files (skipped, reported)

    def _files(self) -> Iterable[tuple[Path, bool]]:
        for d in self.dirs:
            if d.is_dir():
                for p in sorted(d.glob("*.json")):
                    yield p, d == self.shipped_dir

    def _read(self, path: Path, shipped: bool) -> KBEntry | None:
        try:
            data = json.loads(path.read_text())
            if data.get("schema") != SCHEMA:
                raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA!r}")
            origin = f"knowledge-base:{path.name}"
            return KBEntry(path, dict(data["key"]),
                           [Proposal.from_json(m, origin) for m in data.get("mappings", [])],
                           [Explanation.from_json(u, origin) for u in data.get("unmapped", [])],
                           list(data.get("aligners", [])), shipped)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.errors.append(f"{path}: {e}")
            return None

    def lookup(self, key: KBKey) -> list[KBEntry]:
        """Entries that apply to ``key``, most specific first: exact versions before ``any``, the user's before
        the shipped ones."""
        found = []
        for path, shipped in self._files():
            entry = self._read(path, shipped)
            if entry is not None and key.matches(entry.key):
                found.append(entry)
        found.sort(key=lambda e: (not e.exact, e.shipped))
        return found

    def hints(self, classes: set[str], exclude: set[Path] = frozenset(), limit: int = 4) -> list[dict[str, Any]]:
        """Validated mappings of the same component classes made for *other* models: in-context examples."""
        out: list[dict[str, Any]] = []
        for path, shipped in self._files():
            if path in exclude:
                continue
            entry = self._read(path, shipped)
            if entry is None:
                continue
            for m in entry.mappings:
                if m.target_class in classes:
                    out.append({"from": path.name, **m.to_json()})
            for u in entry.unmapped:
                if u.target_class in classes:
                    out.append({"from": path.name, "unmapped": True, **u.to_json()})
            if len(out) >= limit:
                break
        return out[:limit]

    def store(self, key: KBKey, mappings: list[Proposal], unmapped: list[Explanation],
              aligners: list[dict[str, Any]], *, model: str) -> Path | None:
        """Merge validated results into the user's file for ``key`` (same target path: the new one wins)."""
        if self.user_dir is None:
            return None
        path = self.user_dir / key.filename()
        stamp = {"by": "agent", "model": model, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data: dict[str, Any] = {"schema": SCHEMA, "key": asdict(key), "mappings": [], "unmapped": [], "aligners": []}
        if path.exists():
            try:
                old = json.loads(path.read_text())
                if old.get("schema") == SCHEMA:
                    data.update({k: list(old.get(k, [])) for k in ("mappings", "unmapped", "aligners")})
            except (OSError, ValueError):
                pass
        new_targets = {m.target for m in mappings} | {u.target for u in unmapped}
        for section in ("mappings", "unmapped"):
            data[section] = [x for x in data[section] if x.get("target") not in new_targets]
        data["aligners"] = [x for x in data["aligners"] if x.get("target") not in {a["target"] for a in aligners}]
        data["mappings"] += [{**m.to_json(), "validated": stamp} for m in mappings]
        data["unmapped"] += [{**u.to_json(), "validated": stamp} for u in unmapped]
        data["aligners"] += [{**a, "validated": stamp} for a in aligners]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kb-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        return path
