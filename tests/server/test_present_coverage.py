"""server.present on what a diagnosis observed (issues 22/23): the hover and the diagnostics word a finding with the
report's ``Suspect.summary``, the hover lists the report's coverage (not observed, checks, not checked, notes), and an
inconclusive report publishes no diagnostics but its hover says it is inconclusive and why. Pure: no language
server, no engine run.

The extension's fixtures (``extension/test/fixtures/{inconclusive,findings,demo}-report-updated.json``) are
``ekka/reportUpdated`` payloads: next to the report they carry what the server sends in Python's words (``headline``,
``coverage``, ``coverageLine``: :func:`server.present.rendered`), which the extension's unit tests check the "Silent
errors" view shows verbatim; the test here that they are what the server sends for their reports — ``coverage()``'s
sections, ``coverage_line()``, ``short_headline()`` (after a wording change there:
``EKKA_UPDATE_FIXTURES=1 pytest tests/server/test_present_coverage.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from ekka_core.contracts.report import Report, SeriesPoint, TargetLocation, short_headline
from ekka_core.report.coverage import coverage, coverage_line
from ekka_core.report.findings import summary
from server.present import Result, diagnostics, hover, path_key, rendered

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "extension" / "test" / "fixtures"
NAMES = ["inconclusive-report-updated.json", "findings-report-updated.json", "demo-report-updated.json"]
RENDERED = ("headline", "coverage", "coverageLine")


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", NAMES)
def test_the_extensions_fixtures_carry_what_the_server_sends_for_their_reports(name):
    fixture = load(name)
    report = Report.from_json(fixture["report"])
    sent = rendered(report)
    if os.environ.get("EKKA_UPDATE_FIXTURES"):
        fixture = {k: v for k, v in fixture.items() if k not in RENDERED} | sent
        (FIXTURES / name).write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    assert {k: fixture.get(k) for k in RENDERED} == sent, "regenerate: EKKA_UPDATE_FIXTURES=1 pytest " + __file__
    # the payload is coverage.py's sections and line, and the job's headline, as they are (nothing re-worded)
    assert [(s["key"], s["title"], [(i["label"], i["text"]) for i in s["items"]]) for s in sent["coverage"]] == \
        [(s.key, s.title, s.items) for s in coverage(report)]
    assert sent["coverageLine"] == coverage_line(report) and sent["headline"] == short_headline(report)
    # the summaries the editor shows verbatim are findings.py's (the demo's report is from before ``summary``)
    for s in report.suspects + report.conventions:
        assert s.summary == summary(s) or (name.startswith("demo") and not s.summary)


def test_the_payload_of_an_inconclusive_report_says_what_could_not_be_observed():
    sent = rendered(Report.from_json(load("inconclusive-report-updated.json")["report"]))
    assert sent["headline"] == "inconclusive: could not observe modules"
    assert [s["key"] for s in sent["coverage"]] == ["missing", "checks", "unchecked", "notes"]
    assert sent["coverage"][0]["items"][0]["text"].startswith("no module was compared")
    assert json.loads(json.dumps(sent)) == sent          # plain JSON: lists and dicts, no tuples


def line_text(path: str, line: int) -> str:
    return "class X:"


def test_diagnostics_word_each_finding_with_its_summary():
    r = Report.from_json(load("findings-report-updated.json")["report"])
    diags = diagnostics(Result("j", r), line_text)
    msgs = [d.message for ds in diags.values() for d in ds]
    nf = next(m for m in msgs if m.startswith("Ekka #1:"))
    assert nf.startswith("Ekka #1: model.layers.1.mlp.act_fn (SiluAndMul) [non-finite] — 12 NaN/Inf output "
                         "value(s) where the reference is finite, first at request 0 token 5 (threshold 2.0)")
    glue = next(m for m in msgs if m.startswith("Ekka #3:"))
    assert "[glue] — the code between self_attn and post_attention_layernorm in its forward" in glue
    plain = next(m for m in msgs if m.startswith("Ekka #2:"))
    assert plain.startswith("Ekka #2: model.layers.1.self_attn.attn (Attention) — error ratio 37.2, from token 3 "
                            "(prefill) (threshold 2.0); reference module(s): model.layers.1.self_attn.attn")


def test_a_report_without_summaries_is_worded_by_findings_too():
    """An older report.json (no ``summary``, no ``kind``): the same words, rendered here."""
    r = Report.from_json({"suspects": [{"rank": 1, "target": {"module": "m", "class": "C", "file": "/x/c.py",
                                                              "line": 3}, "error_ratio": 12.5, "onset_token": 4}],
                          "verdict": "divergent"})
    [[d]] = diagnostics(Result("j", r), line_text).values()
    assert d.message.startswith("Ekka #1: m (C) — error ratio 12.5, from token 4 (threshold 2.0)")


def test_the_hover_names_each_suspect_by_its_summary_and_lists_the_coverage_briefly():
    r = Report.from_json(load("findings-report-updated.json")["report"])
    r.unchecked = r.unchecked * 5
    t = r.suspects[1].target
    text = hover(Result("j", r), path_key(t.file), t.line - 1).contents.value
    assert "- suspect **#2** `model.layers.1.self_attn.attn`: error ratio 37.2, from token 3 (prefill)" in text
    lines = text.splitlines()
    for title in ("**Checks**", "**Departures from the reference's rounding**", "**Not checked (5)**", "**Notes**"):
        assert title in lines, title
    assert "**Not observed**" not in lines
    assert "- ✗ modules: diverges — model.layers.1.self_attn.attn (Attention) departs first, of 51 compared" in lines
    assert ("- `model.layers.0.input_layernorm`: departs from the reference's own rounding (3.3× its rounding "
            "error)") in lines
    # the departure that is a suspect is not listed twice
    assert not any(ln.startswith("- `model.norm`") for ln in lines)
    i = lines.index("**Not checked (5)**")
    assert lines[i + 2:i + 6] == ["- `logits_processor`: no HF module: the engine's LogitsProcessor"] * 3 + \
        ["- … and 2 more (report.md)"]
    # the coverage follows the suspects
    assert lines.index("**Checks**") > next(k for k, ln in enumerate(lines) if ln.startswith("- suspect **#2**"))


def test_an_inconclusive_report_publishes_no_diagnostics_and_its_hover_says_why():
    r = Report.from_json(load("inconclusive-report-updated.json")["report"])
    assert r.verdict == "inconclusive" and r.missing
    # even a suspect the report kept (none does today) gets no squiggle: nothing was found, nothing could be seen
    r.suspects = Report.from_json(load("findings-report-updated.json")["report"]).suspects[:1]
    result = Result("j", r)
    assert diagnostics(result, line_text) == {}
    t = r.suspects[0].target
    text = hover(result, path_key(t.file), t.line - 1).contents.value
    lines = text.splitlines()
    assert lines[0].endswith("· inconclusive (job j)")
    assert lines[2].startswith("**Inconclusive**: the diagnosis could not observe what a verdict needs")
    assert lines[4] == "**Not observed**"
    assert lines[6] == "- " + r.missing[0]
    assert "- ? modules: inconclusive — no component pair was compared" in lines
    n = len(r.unchecked)
    assert f"**Not checked ({n})**" in lines and f"- … and {n - 3} more (report.md)" in lines
    assert "- `<root>`: knowledge base: root" not in lines          # past the first few
    # what was not observed comes before the suspects
    assert lines.index("**Not observed**") < next(k for k, ln in enumerate(lines) if ln.startswith("- suspect **#1**"))


def test_a_module_hover_on_an_inconclusive_report_with_compared_modules():
    """Inconclusive for another reason (an output check saw no position) while modules were compared: the table
    is there, with what was not observed above it."""
    r = Report.from_json(load("inconclusive-report-updated.json")["report"])
    r.plots.series = [SeriesPoint(component="model.layers.0.mlp", cls="LlamaMLP", error_ratio=0.98)]
    loc = TargetLocation(module="model.layers.0.mlp", cls="LlamaMLP", file="/x/llama.py", line=70)
    h = hover(Result("j", r, modules={"model.layers.0.mlp": loc}), path_key("/x/llama.py"), 69)
    assert isinstance(h, types.Hover)
    text = h.contents.value
    assert "| `model.layers.0.mlp` | 0.98 |" in text and "**Not observed**" in text
