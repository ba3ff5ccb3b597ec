"""The importer: :func:`import_repro` reads a repro script (never running it) into :class:`ReproImport` — the spec
fields the script determines, what it leaves unknown, and the spec file that says so."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from ekka_core.contracts.errors import BadInput
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.repro.engine import find_engines, merge_engines, read_engine, resolve_auto_dtype
from ekka_core.repro.requests import add_inputs, drop_repeats_across_engines, generation_calls, read_call
from ekka_core.repro.script import Script, Unknown
from ekka_core.repro.toml import SPEC_KEYS, to_toml

INPUT_FIELDS = ("prompts", "messages", "prompt_token_ids", "requests")


@dataclass
class ReproImport:
    """What :func:`import_repro` found. ``fields`` holds only the DiagnosisSpec fields the script determines, as
    JSON (``DiagnosisSpec.from_json(fields)`` builds the spec when ``model`` and an input are among them)."""

    path: Path
    fields: dict[str, Any]
    unknown: list[Unknown] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    engine_line: int = 0

    @property
    def has_inputs(self) -> bool:
        return any(self.fields.get(k) for k in INPUT_FIELDS)

    @property
    def complete(self) -> bool:
        """True when every value the spec needs came out of the script (nothing left to fill in by hand)."""
        return not self.unknown and "model" in self.fields and self.has_inputs

    def spec(self) -> DiagnosisSpec:
        """The DiagnosisSpec (not validated). BadInput when the script did not determine the model or any input."""
        missing = [k for k, ok in (("model", bool(self.fields.get("model"))), ("prompts", self.has_inputs)) if not ok]
        if missing:
            wanted = set(missing) | ({"messages", "prompt_token_ids"} if "prompts" in missing else set())
            details = "; ".join(str(u) for u in self.unknown if u.field in wanted) or "not found in the script"
            raise BadInput(f"{self.path}: cannot determine {' and '.join(missing)} ({details})",
                           fix=f"write the spec with `ekka import-repro {self.path} --out SPEC.ekka.toml` "
                               "and fill in the missing values")
        return DiagnosisSpec.from_json(self.fields, where=f"the spec imported from {self.path}")

    def to_toml(self) -> str:
        """The spec file: the fields found, plus commented placeholders for what must be filled in by hand."""
        fields = dict(self.fields)
        todo = {u.field.split(".", 1)[0] for u in self.unknown}
        comments = [f"Imported by `ekka import-repro` from {self.path} (the script was read, never run)."]
        comments += [f"note: {n}" for n in self.notes]
        comments += [f"UNKNOWN {u}" for u in self.unknown]
        # An empty prompts list keeps the file loadable and DiagnosisSpec.validate() names it. No placeholder
        # for model: from_toml would resolve "" to the spec file's own directory; without the key it says
        # "give at least `model` and `prompts`".
        if not self.has_inputs:
            fields.setdefault("prompts", [])
        return to_toml(fields, comments=comments, todo=todo)

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "fields": self.fields, "unknown": [asdict(u) for u in self.unknown],
                "notes": self.notes, "engine_line": self.engine_line, "complete": self.complete}


def import_repro(path: Path | str) -> ReproImport:
    """Read a vLLM or SGLang repro script (never executing it) and return the equivalent spec fields."""
    script = Script.read(Path(path))
    engines = find_engines(script)
    if not engines:
        raise BadInput(f"{script.path} has no LLM(...) or Engine(...) call",
                       fix="Ekka imports scripts that build a vLLM `LLM(model=...)` or an SGLang "
                           "`sgl.Engine(model_path=...)`; write a spec file or pass --model and --prompt")
    for eng in engines:
        read_engine(script, eng)
    fields: dict[str, Any] = {"reference": "hf"}
    kinds = sorted({e.kind for e in engines})
    if len(kinds) == 1:
        fields["target"] = kinds[0]
    else:
        first = engines[0]
        script.add(Unknown("target", first.line, script.snippet(first.call),
                           "the script builds both vLLM and SGLang engines", "set `target` to the engine that shows the bug"))
    merge_engines(script, engines, fields)

    matched, candidates = generation_calls(script, engines)
    sampling_seen: list[tuple[cst.CSTNode, dict[str, Any]]] = []
    waves = [w for eng, call, method in matched for w in read_call(script, eng, call, method, sampling_seen)]
    if len(engines) > 1:
        waves = drop_repeats_across_engines(script, waves)
    add_inputs(script, fields.get("target", kinds[0]), waves, sampling_seen, fields)
    if not matched:
        shown = "; ".join(f"line {script.line(c)}: {script.snippet(c, 60)}" for c in candidates[:5])
        script.add(Unknown("prompts", engines[0].line, script.snippet(engines[0].call),
                           "no generate(...) call on this engine was found",
                           "put the prompt text in `prompts`" + (f" (calls that might use the engine: {shown})"
                                                                  if shown else "")))
    resolve_auto_dtype(script, fields)
    model = fields.get("model")
    if isinstance(model, str) and model.startswith((".", "~")):
        script.note(f"model path {model!r} is relative to the directory the script was run from; "
                    "the spec resolves a relative model against the spec file's directory")
    script.unknown.sort(key=lambda u: (u.line, u.field))
    return ReproImport(script.path, {k: fields[k] for k in SPEC_KEYS if k in fields}, script.unknown,
                       script.notes, engines[0].line)
