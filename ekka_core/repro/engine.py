"""The engine a repro script builds (``LLM(...)``, ``vllm.LLM(...)``, ``sgl.Engine(...)``) and its arguments: the
model, the dtype and **every other keyword as given** — the served configuration (spec ``engine_args``). What a
traced run has to change (CUDA graphs, compilation, prefix caching) is the capture stage's decision, which it
records; nothing is dropped here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from ekka_core.contracts.spec import DTYPES, checkpoint_dtype
from ekka_core.repro.script import Script, Unknown, Unresolved
from ekka_core.repro.toml import toml_problem

ENGINES = ("vllm.LLM", "sglang.Engine")
MODEL_KW = {"vllm": "model", "sglang": "model_path"}
DTYPE_NAMES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "half": "float16", "fp16": "float16",
    "float32": "float32", "float": "float32", "fp32": "float32",
}
_MISSING = object()


@dataclass
class Engine:
    kind: str                                          # "vllm" | "sglang"
    call: cst.Call
    line: int
    receivers: set[str]                                # source text of the names it is bound to ("llm", "self.llm")
    fields: dict[str, Any] = field(default_factory=dict)   # model, dtype, engine_args.<k>
    unknown: list[Unknown] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def find_engines(script: Script) -> list[Engine]:
    """Every engine constructor call, in source order, with the names it is bound to."""
    found: list[Engine] = []
    for call in script.calls:
        q = script.qualname(call.func)
        if q not in ENGINES:
            continue
        receivers: set[str] = set()
        parent = script.parents.get(call)
        if isinstance(parent, cst.Assign):
            receivers = {" ".join(script.code(t.target).split()) for t in parent.targets}
        elif isinstance(parent, (cst.AnnAssign, cst.NamedExpr)):
            receivers = {script.code(parent.target)}
        elif isinstance(parent, cst.WithItem) and parent.asname is not None:
            receivers = {script.code(parent.asname.name)}
        found.append(Engine(q.split(".")[0], call, script.line(call), receivers))
    return found


def read_engine(script: Script, eng: Engine) -> None:
    """The engine call's arguments into ``eng.fields`` (``model``, ``dtype``, ``engine_args.<name>``)."""
    kind, call = eng.kind, eng.call
    model_kw = MODEL_KW[kind]
    # (keyword, expression or already-evaluated value, node to point at, whether it is evaluated)
    args: list[tuple[str, Any, cst.CSTNode, bool]] = []
    for i, a in enumerate(call.args):
        if a.star == "**":
            try:
                splat = script.value(a.value)
                if not isinstance(splat, dict):
                    raise Unresolved(a, "`**` of something that is not a dict")
            except Unresolved as e:
                eng.unknown.append(script.unknown_for("engine_args", e, "write the engine arguments out as "
                                                      "keyword arguments or fill in [engine_args]"))
                continue
            for k, v in splat.items():
                args.append((str(k), v, a, True))
        elif a.star == "*":
            eng.unknown.append(script.unknown_for("engine_args", Unresolved(a, "`*` arguments"),
                                                  "write the engine arguments out as keyword arguments"))
        elif a.keyword is None:
            if i == 0:
                args.append((model_kw, a.value, a, False))
            else:
                eng.unknown.append(script.unknown_for("engine_args", Unresolved(
                    a, f"positional argument {i + 1} of the engine"), "pass it as a keyword argument"))
        else:
            args.append((a.keyword.value, a.value, a, False))
    for kw, expr, node, evaluated in args:
        try:
            value = expr if evaluated else script.value(expr)
        except Unresolved as e:
            fld = "model" if kw == model_kw else "dtype" if kw == "dtype" else f"engine_args.{kw}"
            if kw == "dtype":
                dt = _torch_dtype(script, expr)
                if dt is not None:
                    eng.fields["dtype"] = dt
                    continue
            what = {"model": "set `model` to the checkpoint directory or HF model id the script loads",
                    "dtype": "set `dtype` to bfloat16, float16 or float32"}.get(
                fld, f"set `{kw}` under [engine_args] to the value the script uses, or leave it out")
            eng.unknown.append(script.unknown_for(fld, e, what))
            continue
        if kw == model_kw:
            if not isinstance(value, str) or not value or toml_problem(value):
                eng.unknown.append(script.unknown_for("model", Unresolved(node, "model is not a string"),
                                                      "set `model` to a checkpoint directory or HF id"))
            else:
                eng.fields["model"] = value
        elif kw == "dtype":
            _dtype(script, eng, value, node)
        elif value is None:
            eng.notes.append(f"{kw}=None (line {script.line(node)}) left out: None is the engine's default "
                             "(and TOML has no null)")
        else:
            problem = toml_problem(value)
            if problem:
                eng.unknown.append(script.unknown_for(f"engine_args.{kw}", Unresolved(node, problem),
                                                      f"set `{kw}` under [engine_args] by hand"))
            else:
                eng.fields[f"engine_args.{kw}"] = value
    if "dtype" not in eng.fields and not any(u.field == "dtype" for u in eng.unknown):
        eng.fields["dtype"] = "auto"  # what the engine does when the script does not say
    if "model" not in eng.fields and not any(u.field == "model" for u in eng.unknown):
        eng.unknown.append(script.unknown_for("model", Unresolved(call, f"the engine is built without `{model_kw}`"),
                                              "set `model` to the checkpoint directory or HF id"))


def _torch_dtype(script: Script, expr: cst.BaseExpression) -> str | None:
    try:
        node = script.deref(expr)
    except Unresolved:
        return None
    if isinstance(node, cst.Attribute) and script.modules.get(script.code(node.value), script.code(node.value)) \
            == "torch" and node.attr.value in DTYPE_NAMES:
        return DTYPE_NAMES[node.attr.value]
    return None


def _dtype(script: Script, eng: Engine, value: Any, node: cst.CSTNode) -> None:
    if isinstance(value, str) and value.lower() in DTYPE_NAMES:
        eng.fields["dtype"] = DTYPE_NAMES[value.lower()]
    elif value is None or (isinstance(value, str) and value.lower() == "auto"):
        eng.fields["dtype"] = "auto"
    else:
        eng.unknown.append(script.unknown_for("dtype", Unresolved(node, f"dtype {value!r} is not one Ekka traces"),
                                              "use bfloat16, float16 or float32"))


def merge_engines(script: Script, engines: list[Engine], fields: dict[str, Any]) -> None:
    """The settings every engine shares into ``fields``; those they disagree on are Unknown (Ekka diagnoses one
    configuration)."""
    for eng in engines:
        for u in eng.unknown:
            script.add(u)
        for n in eng.notes:
            script.note(n)
    keys: list[str] = []
    for eng in engines:
        keys += [k for k in eng.fields if k not in keys]
    unknown_fields = {u.field for u in script.unknown}
    engine_args: dict[str, Any] = {}
    for key in keys:
        values = [(e, e.fields.get(key, _MISSING)) for e in engines]
        distinct = {json.dumps(v, sort_keys=True, default=str) for _, v in values}
        if key in unknown_fields:  # one engine's value is unknown: already reported
            continue
        if len(distinct) > 1:
            shown = ", ".join(f"line {e.line}: {'not set' if v is _MISSING else repr(v)}" for e, v in values)
            script.add(Unknown(key, engines[0].line, script.snippet(engines[0].call),
                               f"the script builds {len(engines)} engines that differ in "
                               f"{key.replace('engine_args.', '')} ({shown})",
                               "Ekka diagnoses one engine configuration: keep the one that shows the bug"))
            continue
        value = values[0][1]
        if key.startswith("engine_args."):
            engine_args[key.split(".", 1)[1]] = value
        else:
            fields[key] = value
    if len(engines) > 1:
        script.note(f"the script builds {len(engines)} engines (lines "
                    f"{', '.join(str(e.line) for e in engines)}); settings they share are imported")
    fields["engine_args"] = engine_args


def resolve_auto_dtype(script: Script, fields: dict[str, Any]) -> None:
    """``dtype='auto'`` (set so, or not set): the checkpoint's declared dtype when the model is a local checkpoint,
    else ``auto`` is left to the diagnosis (DiagnosisSpec resolves it when it starts)."""
    if fields.get("dtype") != "auto":
        return
    del fields["dtype"]
    model = fields.get("model")
    what = "dtype='auto' (set so, or not set) makes the engine use the checkpoint's own dtype"
    resolved = None
    if isinstance(model, str) and model:
        for base in (Path(model).expanduser(), script.path.parent / model):
            declared = checkpoint_dtype(str(base))
            if declared:
                resolved = declared if declared in DTYPES else None
                break
    if resolved:
        fields["dtype"] = resolved
        script.note(f"{what}: {resolved} (from its config.json)")
    else:
        script.note(f"{what}; the spec keeps dtype auto too (resolved from the checkpoint's config.json when the "
                    "diagnosis starts) — set `dtype` to pin it")
