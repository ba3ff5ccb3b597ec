"""One JSON codec for the contracts' dataclasses: ``to_json``, ``from_json`` and ``json_schema``, all read from the
dataclasses' own type hints, so a field is declared once and its JSON form, its parsing and its schema follow.

Why dataclasses and not pydantic: the contracts are imported by light processes (the language server, the remote
client and host, the CLI before a run starts) that must not need more than the standard library; every earlier
contract is a dataclass already, and the few things a validator library would add (renames, strict floats, a
schema) fit in this module.

Conventions:

* a field whose JSON name is not a Python identifier (``class``) says so with ``field(metadata={"json": "class"})``;
* a field the schema requires although Python gives it a default (a contract's minimum: report.json's ``schema``,
  ``verdict``, ``suspects``) says so with ``metadata={"required": True}``;
* floats are written strictly: NaN/±inf become :data:`NON_FINITE_JSON` (JSON has no NaN) — a report that says a
  value was not finite says it in a field of its own, never through this number;
* a class with its own ``to_json`` / ``from_json`` (a spec, which validates itself) is written and read by them, and
  is an open object in the schema;
* unknown keys are ignored when reading (later schema versions only add fields), missing keys take the field's
  default.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from typing import Any, Union, get_args, get_origin, get_type_hints

NON_FINITE_JSON = 1e9


def json_name(f: dataclasses.Field) -> str:
    return f.metadata.get("json", f.name)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def to_json(value: Any) -> Any:
    """A dataclass (or a list / dict / scalar of them) as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        own = getattr(type(value), "to_json", None)
        if own is not None and getattr(type(value), "__jsonable_own__", False):
            return own(value)
        return {json_name(f): to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE_JSON
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def from_json(cls: Any, data: Any) -> Any:
    """``data`` (plain JSON values) read back as ``cls`` — a dataclass, or a typing form over dataclasses."""
    return _read(cls, data)


def _read(tp: Any, data: Any) -> Any:
    if tp is Any or tp is object:
        return data
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return _read(args[0], data) if len(args) == 1 else data
    if origin is typing.Literal:
        return data
    if origin in (list, tuple, set):
        args = get_args(tp)
        item = args[0] if args else Any
        items = [_read(item, v) for v in (data or [])]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        kt, vt = get_args(tp) or (str, Any)
        return {(int(k) if kt is int else k): _read(vt, v) for k, v in (data or {}).items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if dataclasses.is_dataclass(tp):
        if getattr(tp, "__jsonable_own__", False):
            return tp.from_json(data)
        if not isinstance(data, dict):
            raise ValueError(f"{tp.__name__}: expected an object, got {type(data).__name__}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            key = json_name(f)
            if key in data:
                kwargs[f.name] = _read(hints[f.name], data[key])
        return tp(**kwargs)
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    return data


def json_schema(cls: type, *, schema_id: str | None = None) -> dict[str, Any]:
    """A JSON Schema (2020-12) of ``cls``, every nested dataclass under ``$defs``."""
    defs: dict[str, Any] = {}
    root = _schema(cls, defs)
    out: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    if schema_id:
        out["$id"] = schema_id
    out.update(defs.pop(cls.__name__) if root == {"$ref": f"#/$defs/{cls.__name__}"} else root)
    out["$defs"] = dict(sorted(defs.items()))
    return out


def _schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    if tp is Any or tp is object:
        return {}
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a, defs) for a in get_args(tp)]}
    if tp is type(None):
        return {"type": "null"}
    if origin is typing.Literal:
        return {"enum": list(get_args(tp))}
    if origin in (list, tuple, set):
        args = get_args(tp)
        return {"type": "array", "items": _schema(args[0], defs) if args else {}}
    if origin is dict:
        _, vt = get_args(tp) or (str, Any)
        return {"type": "object", "additionalProperties": _schema(vt, defs)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}       # placeholder: recursive types refer to it
            if getattr(tp, "__jsonable_own__", False):
                defs[name] = {"type": "object", "description": (tp.__doc__ or "").strip().splitlines()[0]}
            else:
                hints = _hints(tp)
                props, required = {}, []
                for f in dataclasses.fields(tp):
                    props[json_name(f)] = _schema(hints[f.name], defs)
                    if f.metadata.get("required") or (f.default is dataclasses.MISSING
                                                      and f.default_factory is dataclasses.MISSING):
                        required.append(json_name(f))
                defs[name] = {"type": "object", "properties": props, "required": required}
                if tp.__doc__ and not tp.__doc__.startswith(f"{name}("):
                    defs[name]["description"] = tp.__doc__.strip().splitlines()[0]
        return {"$ref": f"#/$defs/{name}"}
    return {}
