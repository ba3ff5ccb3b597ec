"""The report contract (issue 22, "one typed report"): ``report.json`` is written from and read back into
:class:`~ekka_core.contracts.report.Report`; its JSON Schema (``ekka_core/contracts/report.schema.json``) and the
extension's TypeScript types (``extension/src/report.generated.ts``) are generated from the same dataclasses by
``scripts/gen_protocol_types.py`` and must not drift from them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import types
import typing
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest

from ekka_core.contracts.report import Report, report_schema

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "extension" / "test" / "fixtures"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_protocol_types", REPO / "scripts" / "gen_protocol_types.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- (a) the generated files are up to date ------------------------------------------------------------------

def test_generated_schema_and_typescript_are_up_to_date():
    for path, text in _generator().generated().items():
        rel = path.relative_to(REPO)
        assert path.is_file(), f"{rel} is missing: run `.venv/bin/python scripts/gen_protocol_types.py`"
        assert path.read_text() == text, (f"{rel} differs from ekka_core/contracts/report.py: run "
                                          f"`.venv/bin/python scripts/gen_protocol_types.py` and commit the result")


def test_typescript_has_one_type_per_schema_definition():
    gen = _generator()
    ts = gen.typescript(report_schema())
    assert ts.startswith("// generated from ekka_core/contracts/report.py by scripts/gen_protocol_types.py — "
                         "do not edit")
    for name in ["Report", *report_schema()["$defs"]]:
        assert f"export interface {name} {{" in ts or f"export type {name} = " in ts, name
    # the JSON name, not the Python one; optional where the schema does not require it; null where it allows it
    assert "  class?: string;\n" in ts and "cls:" not in ts and "cls?:" not in ts
    # the contract's minimum (docs/DESIGN.md) is required although Python gives it a default
    assert "  class: string;\n" in ts and "  error_ratio: number | null;\n" in ts
    assert "  rank: number;\n" in ts and "  error_ratio?: number | null;\n" in ts
    assert '  verdict: "divergent" | "consistent" | "inputs-differ" | "inconclusive";\n' in ts
    assert "  engine_args?: Record<string, unknown>;\n" in ts and "  served: unknown;\n" in ts
    assert "  ratios?: (number | null)[][];\n" in ts


# --- (b) a fully populated report survives JSON ---------------------------------------------------------------

def _differs(default: Any, candidates: tuple[Any, ...]) -> Any:
    return next((c for c in candidates if c != default), candidates[0])


def _sample(tp: Any, name: str, default: Any = dataclasses.MISSING) -> Any:
    """A value of type ``tp`` unlike its default: every optional section set, every list non-empty."""
    if tp is Any or tp is object:
        return {"nested": [1, 2.5, "x", None, True]}
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _sample(next(a for a in get_args(tp) if a is not type(None)), name)
    if origin is typing.Literal:
        return _differs(default, get_args(tp))
    if origin in (list, tuple, set):
        args = get_args(tp)
        items = [_sample(args[0] if args else Any, name)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        kt, vt = get_args(tp) or (str, Any)
        return {(7 if kt is int else f"{name}-key"): _sample(vt, name)}
    if tp is bool:
        return _differs(default, (True, False))
    if tp is int:
        return _differs(default, (7, 8))
    if tp is float:
        return _differs(default, (1.25, 2.5))
    if tp is str:
        return _differs(default, (f"{name}-value", f"{name}-other"))
    if dataclasses.is_dataclass(tp):
        hints = get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.init:
                d = f.default if f.default is not dataclasses.MISSING else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
                kwargs[f.name] = _sample(hints[f.name], f.name, d)
        return tp(**kwargs)
    raise AssertionError(f"no sample for {tp!r} ({name})")


def test_a_fully_populated_report_round_trips_through_json():
    report = _sample(Report, "report")
    for f in dataclasses.fields(Report):      # every section set, none left at its default
        value = getattr(report, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert value not in (None, [], {}, "") and value != default, f.name
    assert report.serving.triage.trials and report.bisect.fix.changes and report.agent.usage.calls
    text = json.dumps(report.to_json(), allow_nan=False)       # strict JSON (what the extension's JSON.parse reads)
    data = json.loads(text)
    assert data["suspects"][0]["target"]["class"] == report.suspects[0].target.cls
    keys = json.dumps(data, default=str)
    assert '"cls":' not in keys and '"class":' in keys
    back = Report.from_json(data)
    assert back == report
    assert back.to_json() == data


def test_save_and_load(tmp_path):
    report = _sample(Report, "report")
    report.save(tmp_path / "report.json")
    assert Report.load(tmp_path / "report.json") == report


def test_reading_fills_defaults_and_ignores_unknown_keys():
    r = Report.from_json({"schema": "ekka.report/1", "verdict": "consistent", "suspects": [], "later": 1})
    assert r.verdict == "consistent" and r.serving is None and r.plots.series == [] and r.meta.remote is None


# --- (c) real reports follow the schema -----------------------------------------------------------------------

def _problems(data: Any) -> list[str]:
    """What in ``data`` the report schema rejects (jsonschema when installed, else the required keys)."""
    schema = report_schema()
    try:
        import jsonschema
    except ImportError:
        return _missing_required(data, schema, schema["$defs"], "$")
    jsonschema.Draft202012Validator.check_schema(schema)
    return [f"{e.json_path}: {e.message}" for e in jsonschema.Draft202012Validator(schema).iter_errors(data)]


def _missing_required(data: Any, node: dict[str, Any], defs: dict[str, Any], at: str) -> list[str]:
    if "$ref" in node:
        return _missing_required(data, defs[node["$ref"].rsplit("/", 1)[-1]], defs, at)
    if "anyOf" in node:
        return [] if data is None else _missing_required(data, next(
            a for a in node["anyOf"] if a.get("type") != "null"), defs, at)
    out = []
    if isinstance(data, dict) and "properties" in node:
        out += [f"{at}.{k}: missing" for k in node.get("required", []) if k not in data]
        for k, sub in node["properties"].items():
            if k in data:
                out += _missing_required(data[k], sub, defs, f"{at}.{k}")
    if isinstance(data, list) and "items" in node:
        for i, v in enumerate(data):
            out += _missing_required(v, node["items"], defs, f"{at}[{i}]")
    return out


def test_the_extensions_fixtures_follow_the_schema():
    """The demo report as the server sent it (the extension's tests read it) and a triage section."""
    demo = json.loads((FIXTURES / "demo-report-updated.json").read_text())["report"]
    assert _problems(demo) == []
    assert Report.from_json(demo).top.target.cls == demo["suspects"][0]["target"]["class"]
    serving = json.loads((FIXTURES / "serving-triage.json").read_text())["serving"]
    section = {"schema": "ekka.report/1", "verdict": "divergent", "suspects": [], "serving": serving}
    assert _problems(section) == []
    assert Report.from_json(section).serving.triage is not None


def test_a_written_report_follows_the_schema():
    data = _sample(Report, "report").to_json()
    assert _problems(data) == []
    assert _problems({**data, "verdict": "maybe"}) and _problems({**data, "suspects": [{"rank": 1}]})


@pytest.mark.slow
def test_a_real_diagnosis_report_follows_the_schema(clean_diagnosis):
    """report.json of a whole diagnosis (the clean zoo model through the CLI): valid, and read without loss."""
    _, out = clean_diagnosis("llama", "float32")
    data = json.loads((out / "report.json").read_text())
    assert _problems(data) == []
    assert Report.load(out / "report.json").to_json() == data
