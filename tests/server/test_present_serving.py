"""server.present on reports with a ``serving`` section (configuration triage, issue 16) and a ``bisect`` section
(release bisection, issue 17): the hover says under which configuration the suspect diverges and was traced, the
diagnostics name triage's culprit, and the code lenses point at the release that changed the suspect. Pure: no
language server, no engine run. The reports are written as the worker sends them (JSON) and read as the server does
(``Report.from_json``)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from ekka_core.contracts.errors import InternalFailure
from ekka_core.contracts.report import Report, TargetLocation
from server.jobs import WorkerResult
from server.present import Result, code_lenses, diagnostics, hover, path_key, serving_line, serving_suffix
from server.protocol import CLIENT_SHOW_DIVERGENCE, CLIENT_SHOW_RELEASE_DIFF

REPO = Path(__file__).resolve().parents[2]
ATTN = "/envs/vllm-1.1/site-packages/vllm/attention/layer.py"
NORM = "/envs/vllm-1.1/site-packages/vllm/layers/layernorm.py"
OPS = "/envs/vllm-1.1/site-packages/vllm/ops/rotary.py"


def line_text(path: str, line: int) -> str:
    return "class X:"


def suspect(rank: int, module: str, cls: str, file: str, line: int, ratio: float) -> dict[str, Any]:
    return {"rank": rank, "target": {"module": module, "class": cls, "file": file, "line": line},
            "reference": {"modules": [module]}, "error_ratio": ratio, "onset_token": 11}


def check(label: str, ratio: float, diverges: bool) -> dict[str, Any]:
    return {"label": label, "ratio": ratio, "diverges": diverges, "threshold": 2.0, "positions": [], "first": None,
            "cached_tokens": 0, "same_dtype": None, "note": ""}


CHANGES = [
    {"arg": "enforce_eager", "served": False, "traced": True, "why": "hooks do not fire inside a compiled graph"},
    {"arg": "max_num_seqs", "served": 256, "traced": 1, "why": "requests run one at a time"},
]

SERVING = {
    "served_args": {"model": "/m", "seed": 0, "dtype": "bfloat16"},
    "served_resolved": {"enforce_eager": False, "compilation_mode": 2, "max_num_seqs": 256},
    "served": check("served configuration", 54.6, True),
    "traced": check("traced baseline", 0.94, False),
    "traced_args": {"model": "/m", "enforce_eager": True, "max_num_seqs": 1},
    "changes": CHANGES,
    "triage": {
        "served": check("served configuration", 54.6, True), "baseline": check("traced baseline", 0.94, False),
        "differing": {"batching": {"served": 256, "baseline": 1}},
        "ruled_out": {"prefix_caching": "no request hit the prefix cache in the served run"},
        "trials": [{"factors": ["batching"], "args": {}, "ratio": 54.8, "diverges": True, "seconds": 7.7,
                    "error": None}],
        "culprit": ["batching"], "direction": "served-diverges",
        "words": "diverges only with batch composition (several requests in one step: max_num_seqs) on",
        "traced_under": ["batching"], "untraceable": [],
    },
}

BISECT = {
    "schema": "ekka.bisect/1", "outcome": "regression-found", "last_good": "1.0", "first_bad": "1.1",
    "suspect": {"module": "model.layers.0.self_attn.attn", "class": "Attention", "file": ATTN, "line": 40},
    "tried": [], "fix": None, "note": "",
    "changes": [
        {"symbol": "vllm.attention.layer.Attention", "kind": "class", "status": "changed", "file_good": "/g/layer.py",
         "line_good": 40, "file_bad": ATTN, "line_bad": 40, "unified_diff": "-a\n+b\n"},
        {"symbol": "vllm.layers.layernorm.rms_norm", "kind": "function", "status": "changed",
         "file_good": "/g/layernorm.py", "line_good": 12, "file_bad": NORM, "line_bad": 14, "unified_diff": "-x\n+y\n"},
        {"symbol": "vllm.ops.rotary.apply", "kind": "function", "status": "added", "file_good": None,
         "line_good": None, "file_bad": OPS, "line_bad": 3, "unified_diff": "+new\n"},
        {"symbol": "vllm.ops.rotary.gone", "kind": "function", "status": "removed", "file_good": "/g/rotary.py",
         "line_good": 9, "file_bad": None, "line_bad": None, "unified_diff": "-old\n"},
    ],
}


def report(serving: Any = None, bisect: Any = None) -> Report:
    r: dict[str, Any] = {
        "schema": "ekka.report/1", "verdict": "divergent", "threshold": 2.0,
        "suspects": [suspect(1, "model.layers.0.self_attn.attn", "Attention", ATTN, 40, 57.6),
                     suspect(2, "model.layers.0.input_layernorm", "RMSNorm", NORM, 80, 3.1)],
        "plots": {"series": [{"component": "model.layers.0.self_attn.attn", "class": "Attention",
                              "error_ratio": 57.6, "input_ratio": 0.9}]},
    }
    if serving is not None:
        r["serving"] = serving
    if bisect is not None:
        r["bisect"] = bisect
    return Report.from_json(r)


def hover_text(r: Report, file: str = ATTN, line: int = 39) -> str:
    h = hover(Result("j", r), path_key(file), line)
    assert h is not None
    return h.contents.value


def lenses(r: Report, file: str) -> list[tuple[int, str, str, list[Any]]]:
    return [(lens.range.start.line, lens.command.title, lens.command.command, lens.command.arguments)
            for lens in code_lenses(Result("j", r), path_key(file), line_text)]


# ------------------------------------------------------------------------------------------------ hover


def test_hover_says_the_served_configuration_diverges_and_what_was_traced():
    text = hover_text(report(SERVING))
    line = next(ln for ln in text.splitlines() if "served configuration" in ln)
    assert line.startswith("**Diverges in the served configuration** (ratio 54.6×)")
    assert "configuration triage: diverges only with batch composition (several requests in one step: " \
           "max_num_seqs) on" in line
    assert "traced under: the eager baseline + `batching` as served (256; baseline 1)" in line
    # the line sits between the heading and the suspect list, and the table is still there
    lines = text.splitlines()
    assert lines.index(line) < next(i for i, ln in enumerate(lines) if ln.startswith("- suspect **#1**"))
    assert "| `model.layers.0.self_attn.attn` | **57.6** ⚠ |" in text


def test_hover_without_triage_names_the_changes_made_for_tracing():
    serving = {**SERVING, "triage": None}
    line = serving_line(report(serving))
    assert line == ("**Diverges in the served configuration** (ratio 54.6×); traced under: the eager baseline "
                    "(`enforce_eager=true`, `max_num_seqs=1`)")
    many = {**serving, "changes": CHANGES * 3}
    assert serving_line(report(many)).endswith("`max_num_seqs=1`, …)")


def test_hover_when_the_served_configuration_is_the_traced_one():
    """The demo: served = traced baseline (one run), nothing changed for tracing, no triage."""
    serving = {"served_args": {}, "served": check("served configuration (= the traced baseline: one run)", 0.9, False),
               "traced": None, "traced_args": {}, "changes": [], "triage": None}
    assert serving_line(report(serving)) == ("**The served configuration matches the reference** (ratio 0.9×); "
                                             "traced under: the served configuration itself (nothing changed for "
                                             "tracing)")


def test_hover_names_culprits_hooks_cannot_see_into():
    triage = {**SERVING["triage"], "culprit": ["compilation"], "traced_under": [], "untraceable": ["compilation"],
              "words": "diverges only with torch.compile on"}
    line = serving_line(report({**SERVING, "triage": triage}))
    assert "configuration triage: diverges only with torch.compile on" in line
    assert "traced under: the eager baseline (`enforce_eager=true`" in line
    assert line.endswith("; hooks cannot see into compilation")


def test_reports_without_or_with_partial_serving_sections_still_hover():
    plain = hover_text(report())
    assert "served configuration" not in plain.lower() and "- suspect **#1**" in plain
    assert serving_line(report()) is None
    # null members (older reports, a run that stopped early) never raise
    for partial in ({}, {"served": None, "triage": None, "changes": None, "traced_args": None}):
        text = hover_text(report(partial))
        assert "**The served configuration was not checked**" in text
    old = {"served": None, "triage": {**SERVING["triage"], "words": "", "traced_under": None, "differing": None,
                                      "untraceable": None}}
    assert serving_line(report(old)) == ("**Diverges in the served configuration** (ratio 54.6×); traced under: the "
                                         "served configuration itself (nothing changed for tracing)")


# ------------------------------------------------------------------------------------------ diagnostics


def test_diagnostics_end_with_triages_culprit():
    diags = diagnostics(Result("j", report(SERVING)), line_text)
    [d] = diags[path_key(ATTN)]
    assert d.message.endswith("(served: diverges only with batching on)")
    assert d.severity == types.DiagnosticSeverity.Error
    [plain] = diagnostics(Result("j", report()), line_text)[path_key(ATTN)]
    assert "served" not in plain.message
    both = {**SERVING, "triage": {**SERVING["triage"], "direction": "both", "culprit": []}}
    assert serving_suffix(report(both)) == ""
    two = {**SERVING, "triage": {**SERVING["triage"], "culprit": ["custom_ops", "chunked_prefill"]}}
    assert serving_suffix(report(two)) == " (served: diverges only with custom_ops + chunked_prefill on)"


# ------------------------------------------------------------------------------------------ code lenses


def test_release_lens_on_the_suspects_class_line_after_the_divergence_lens():
    got = lenses(report(bisect=BISECT), ATTN)
    assert got == [
        (39, "Ekka #1 · ratio 57.6× · diverges from token 11 · Show divergence", CLIENT_SHOW_DIVERGENCE,
         [{"jobId": "j", "module": "model.layers.0.self_attn.attn"}]),
        # the class itself changed too (file_bad:line_bad is the class line): one release lens, not two
        (39, "changed in 1.1 (last good 1.0) · Show diff", CLIENT_SHOW_RELEASE_DIFF, [{"jobId": "j"}]),
    ]


def test_release_lenses_on_each_changed_symbol_in_the_first_bad_file():
    norm = lenses(report(bisect=BISECT), NORM)
    # rank 2's divergence lens at its class line, and the changed function's release lens at line_bad
    assert (79, "Ekka #2 · ratio 3.1× · diverges from token 11 · Show divergence", CLIENT_SHOW_DIVERGENCE,
            [{"jobId": "j", "module": "model.layers.0.input_layernorm"}]) in norm
    assert (13, "changed in 1.1 (last good 1.0) · Show diff", CLIENT_SHOW_RELEASE_DIFF,
            [{"jobId": "j", "symbol": "vllm.layers.layernorm.rms_norm"}]) in norm
    assert len(norm) == 2
    # a file without marks (open in the editor: the client asks for its lenses) gets its symbols' lenses
    assert lenses(report(bisect=BISECT), OPS) == [
        (2, "added in 1.1 (last good 1.0) · Show diff", CLIENT_SHOW_RELEASE_DIFF,
         [{"jobId": "j", "symbol": "vllm.ops.rotary.apply"}])]
    # a removed symbol has no line in the first bad release; the good release's file gets nothing
    assert lenses(report(bisect=BISECT), "/g/rotary.py") == []


def test_release_lens_follows_the_suspect_the_bisection_names():
    b = copy.deepcopy(BISECT)
    b["suspect"] = {"module": "model.layers.0.input_layernorm", "class": "RMSNorm", "file": NORM, "line": 80}
    b["changes"] = []
    assert [t for _, t, c, _ in lenses(report(bisect=b), ATTN) if c == CLIENT_SHOW_RELEASE_DIFF] == []
    assert [(ln, t, a) for ln, t, c, a in lenses(report(bisect=b), NORM) if c == CLIENT_SHOW_RELEASE_DIFF] == [
        (79, "first bad 1.1 (last good 1.0) · Show bisection", [{"jobId": "j"}])]


def test_no_release_lens_without_a_regression():
    for b in (None, {**BISECT, "outcome": "no-regression", "first_bad": None},
              {**BISECT, "outcome": "bad-from-start", "last_good": None}):
        got = lenses(report(bisect=b), ATTN)
        assert [c for _, _, c, _ in got] == [CLIENT_SHOW_DIVERGENCE], b
        assert lenses(report(bisect=b), NORM)[0][2] == CLIENT_SHOW_DIVERGENCE
        assert lenses(report(bisect=b), OPS) == []


def test_the_worker_result_is_read_once_and_a_report_the_server_cannot_read_fails_the_job():
    got = WorkerResult.from_json({"report": report(bisect=BISECT).to_json(), "paths": {"json": "/o/report.json"},
                                  "modules": {"m": {"class": "A"}}})
    assert got.report.bisect.changes[0].file_bad == ATTN and got.paths == {"json": "/o/report.json"}
    assert got.report.suspects[0].target.cls == "Attention"
    assert got.modules == {"m": TargetLocation(module="m", cls="A")}
    for bad in ({"report": {**report().to_json(), "bisect": "garbage"}}, {"report": None}, {}, None,
                {"report": report().to_json(), "modules": {"m": "garbage"}}):
        with pytest.raises(InternalFailure, match="the Ekka worker sent a report this server cannot read"):
            WorkerResult.from_json(bad)


def test_the_release_diff_command_is_the_extensions():
    """One name on both sides: protocol.ts's constant, the contributed (palette-hidden) command."""
    ts = (REPO / "extension/src/protocol.ts").read_text()
    assert re.search(r'SHOW_RELEASE_DIFF_COMMAND = "([^"]+)"', ts).group(1) == CLIENT_SHOW_RELEASE_DIFF
    manifest = json.loads((REPO / "extension/package.json").read_text())
    assert CLIENT_SHOW_RELEASE_DIFF in [c["command"] for c in manifest["contributes"]["commands"]]
    assert {"command": CLIENT_SHOW_RELEASE_DIFF, "when": "false"} in manifest["contributes"]["menus"]["commandPalette"]
