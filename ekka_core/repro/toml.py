"""Writing a ``.ekka.toml`` spec with the standard library only: :func:`to_toml` (what
:meth:`~ekka_core.contracts.spec.DiagnosisSpec.from_toml` loads back) and :func:`toml_problem` (why a value cannot
be written).

Layout: the scalar fields, then the inputs (``prompts``, ``prompt_token_ids``, ``messages``: arrays, one element a
line), then the ``[engine_args]`` table, then one ``[[requests]]`` table per request of a scenario.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

# DiagnosisSpec fields to_toml writes, in this order (engine_args and requests last: they are tables).
SPEC_KEYS = ("model", "target", "reference", "dtype", "max_new_tokens", "threshold", "prompts", "prompt_token_ids",
             "messages", "engine_args", "requests")
REQUEST_KEYS = ("id", "prompt", "messages", "prompt_token_ids", "max_new_tokens", "after", "sampling")
_ARRAYS = ("prompts", "prompt_token_ids", "messages")

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:  # lone surrogate: not representable in UTF-8 TOML
            raise ValueError(f"string {s!r} holds a lone surrogate and cannot be written as TOML")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(k: Any) -> str:
    if not isinstance(k, str):
        raise ValueError(f"TOML keys must be strings, not {k!r}")
    return k if _BARE_KEY.fullmatch(k) else _toml_str(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if v is None:
        raise ValueError("TOML has no null; leave the value out instead")
    raise ValueError(f"cannot write {v!r} ({type(v).__name__}) as TOML")


def _array(key: str, values: Any) -> str:
    """``key = [`` one element a line ``]`` (a long prompt or a conversation stays readable)."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{key} must be a list")
    return f"{key} = [" + "".join(f"\n    {_toml_value(v)}," for v in values) + ("\n]" if values else "]")


def _comment(text: str) -> list[str]:
    clean = "".join(ch if ch == "\t" or (ord(ch) >= 0x20 and ord(ch) != 0x7F) else " " for ch in text)
    return [f"# {clean}".rstrip()]


def to_toml(spec_fields: dict[str, Any], *, comments: Iterable[str] = (), todo: Iterable[str] = ()) -> str:
    """A ``.ekka.toml`` holding ``spec_fields`` (DiagnosisSpec field names; ``engine_args`` becomes a table,
    ``requests`` — dicts of RequestSpec fields — ``[[requests]]`` tables). ``comments`` go at the top; each field
    named in ``todo`` gets a ``# TODO`` line above it."""
    unknown = set(spec_fields) - set(SPEC_KEYS)
    if unknown:
        raise ValueError(f"not DiagnosisSpec fields: {', '.join(sorted(unknown))}")
    todo = set(todo) & set(SPEC_KEYS)
    lines: list[str] = []
    for c in comments:
        for part in str(c).splitlines() or [""]:
            lines += _comment(part)
    if lines:
        lines.append("")
    for key in SPEC_KEYS:
        if key in ("engine_args", "requests"):
            continue
        if key in todo:
            lines.append(f"# TODO {key}: see the UNKNOWN lines above")
        if key not in spec_fields:
            continue
        value = spec_fields[key]
        if value is None:
            raise ValueError(f"{key} is None; leave it out instead")
        lines.append(_array(key, value) if key in _ARRAYS else f"{key} = {_toml_value(value)}")
    engine_args = spec_fields.get("engine_args")
    if engine_args or "engine_args" in todo:
        if not isinstance(engine_args or {}, dict):
            raise ValueError("engine_args must be a dict")
        lines.append("")
        if "engine_args" in todo:
            lines.append("# TODO engine_args: see the UNKNOWN lines above")
        lines.append("[engine_args]")
        for k, v in (engine_args or {}).items():
            if v is None:
                raise ValueError(f"engine_args.{k} is None; leave it out instead")
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    requests = spec_fields.get("requests") or []
    if requests and not isinstance(requests, list):
        raise ValueError("requests must be a list of request tables")
    if "requests" in todo:
        lines += ["", "# TODO requests: see the UNKNOWN lines above"]
    for r in requests:
        extra = set(r) - set(REQUEST_KEYS) if isinstance(r, dict) else {"(not a table)"}
        if extra:
            raise ValueError(f"not RequestSpec fields: {', '.join(sorted(extra))}")
        lines += ["", "[[requests]]"]
        for key in REQUEST_KEYS:
            if r.get(key) is None or (key == "sampling" and not r[key]):
                continue
            lines.append(_array(key, r[key]) if key == "messages" else f"{key} = {_toml_value(r[key])}")
    return "\n".join(lines) + "\n"


def toml_problem(value: Any) -> str | None:
    """Why a value cannot go into the TOML spec, or None when it can."""
    if value is None:
        return "None inside the value (TOML has no null)"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text with a lone surrogate (not valid Unicode)"
        return None
    if isinstance(value, (bool, int, float)):
        return None
    if isinstance(value, list):
        return next((p for p in map(toml_problem, value) if p), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a dict with non-string keys (TOML tables need string keys)"
        return next((p for p in map(toml_problem, value.values()) if p), None)
    return f"a {type(value).__name__} value"
