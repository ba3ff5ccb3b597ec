"""Generate the report contract's derived files from ekka_core/contracts/report.py (issue 22, "one typed report"):

* ``ekka_core/contracts/report.schema.json`` — the JSON Schema of report.json (:func:`report_schema`);
* ``extension/src/report.generated.ts`` — one TypeScript interface per ``$defs`` entry of that schema, plus
  ``Report`` for the root; the extension's ``protocol.ts`` re-exports them.

Run with the venv's python after changing a report dataclass::

    .venv/bin/python scripts/gen_protocol_types.py

tests/contracts/test_report_schema.py fails while the committed files differ from what this writes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCHEMA_FILE = REPO / "ekka_core" / "contracts" / "report.schema.json"
TS_FILE = REPO / "extension" / "src" / "report.generated.ts"
ROOT_NAME = "Report"
HEADER = ("// generated from ekka_core/contracts/report.py by scripts/gen_protocol_types.py — do not edit\n"
          "// (change the dataclasses, then run: .venv/bin/python scripts/gen_protocol_types.py)\n")
_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


def schema_json(schema: dict[str, Any]) -> str:
    """The schema as ``report.schema.json`` holds it."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def ts_type(node: dict[str, Any]) -> str:
    """The TypeScript type of one schema node."""
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in node:
        parts: list[str] = []
        for alt in node["anyOf"]:
            t = ts_type(alt)
            if t not in parts:
                parts.append(t)
        return " | ".join(parts) if parts else "unknown"
    if "enum" in node:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in node["enum"]) or "never"
    kind = node.get("type")
    if kind == "array":
        item = ts_type(node.get("items", {}))
        return f"({item})[]" if _is_union(item) else f"{item}[]"
    if kind == "object":
        if "properties" in node:
            return "{ " + " ".join(f"{p};" for p in _members(node)) + " }"
        return f"Record<string, {ts_type(node.get('additionalProperties', {}))}>"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
            "null": "null"}.get(kind, "unknown") if kind else "unknown"


def _is_union(t: str) -> bool:
    """Whether ``t`` is a union at its top level (``A | B``, not ``Record<string, A | B>``)."""
    depth = 0
    for i, ch in enumerate(t):
        if ch in "(<{[":
            depth += 1
        elif ch in ")>}]":
            depth -= 1
        elif depth == 0 and t.startswith(" | ", i):
            return True
    return False


def _members(node: dict[str, Any]) -> list[str]:
    required = set(node.get("required", []))
    out = []
    for name, prop in node.get("properties", {}).items():
        key = name if _IDENT.match(name) else json.dumps(name)
        out.append(f"{key}{'' if name in required else '?'}: {ts_type(prop)}")
    return out


def _interface(name: str, node: dict[str, Any]) -> str:
    doc = f"/** {node['description']} */\n" if node.get("description") else ""
    if node.get("type") != "object" or "properties" not in node:
        return f"{doc}export type {name} = {ts_type(node)};\n"
    body = "".join(f"  {m};\n" for m in _members(node))
    return f"{doc}export interface {name} {{\n{body}}}\n"


def typescript(schema: dict[str, Any]) -> str:
    """``report.generated.ts``: the root as ``Report``, then every ``$defs`` entry, in the schema's order."""
    root = {k: v for k, v in schema.items() if k not in ("$schema", "$id", "$defs")}
    if not root.get("description"):
        root["description"] = f"`OUTDIR/report.json`, schema {json.dumps(schema.get('$id', ''))}."
    parts = [HEADER, _interface(ROOT_NAME, root)]
    parts += [_interface(name, node) for name, node in schema.get("$defs", {}).items()]
    return "\n".join(parts)


def generated() -> dict[Path, str]:
    """Every generated file → its content, from the report dataclasses as they are now."""
    sys.path.insert(0, str(REPO))
    from ekka_core.contracts.report import report_schema

    schema = report_schema()
    return {SCHEMA_FILE: schema_json(schema), TS_FILE: typescript(schema)}


def main() -> int:
    for path, text in generated().items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
        else:
            print(f"{path.relative_to(REPO)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
