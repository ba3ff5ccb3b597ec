"""The report stage: report.json follows the ekka.report/1 contract (DESIGN.md), and the Markdown / self-contained HTML
renderings show the suspects, the change point and the layer × position heat map."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ekka_core.analysis import PairResult, Ranking, Suspect
from ekka_core.contracts.report import InputsDiffer, Report, RunMeta, Unchecked
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.report import SCHEMA, build_report, headline, plot_data, write_report

ATTN = "model.layers.1.self_attn.attn"
LAYERS = ["model.layers.0", "model.layers.1", "model.layers.2"]
N_POS = 6
ONSET = 3


def _tok(r_before: float, r_after: float, seqs=(0,)) -> list[tuple[int, int, float]]:
    return [(s, p, r_before if p < ONSET else r_after) for s in seqs for p in range(N_POS)]


def _ranking() -> Ranking:
    pairs = [
        PairResult("model.embed_tokens", "VocabParallelEmbedding", 0, ["model.embed_tokens"], "same-path",
                   1.0, None, 0.001, _tok(1.0, 1.0)),
        PairResult(LAYERS[0], "LlamaDecoderLayer", 1, [LAYERS[0]], "same-path", 1.1, 1.0, 0.002, _tok(1.1, 1.1)),
        PairResult(ATTN, "Attention", 2, ["model.layers.1.self_attn.o_proj"], "attention-core ↔ input of o_proj",
                   30.0, None, 0.05, _tok(1.0, 30.0)),
        # two sequences: the heat map takes the max over sequences per position
        PairResult(LAYERS[1], "LlamaDecoderLayer", 3, [LAYERS[1]], "same-path", 28.0, 25.0, 0.05,
                   _tok(1.0, 28.0, seqs=(0,)) + [(1, p, 50.0) for p in range(N_POS)]),
        PairResult(LAYERS[2], "LlamaDecoderLayer", 4, [LAYERS[2]], "same-path", 35.0, 28.0, 0.06, _tok(1.0, 35.0)),
        PairResult("logits_processor", "LogitsProcessor", 5, [""], "logits ↔ reference final logits",
                   40.0, None, 0.1, [(0, N_POS - 1, 40.0)]),
    ]
    suspects = [
        Suspect(1, ATTN, "Attention", "/venv/site-packages/vllm/attention/layer.py", 120, None, None,
                ["model.layers.1.self_attn.o_proj"], 30.0, None, ONSET, "prefill",
                "change point: output error ratio 30.0 while the module before it agrees"),
        Suspect(2, "model.layers.1.self_attn", "LlamaAttention", "/venv/site-packages/vllm/llama.py", 200, None,
                None, [], float("nan"), None, None, None, "encloses the top suspect"),
    ]
    return Ranking("divergent", 2.0, "bfloat16", pairs, suspects, change_point=2,
                   unchecked=[Unchecked("model.layers.0.self_attn.rotary_emb", "checked through attn")],
                   notes=["post-logits sampling is outside per-module comparison"], prompt_lens=[N_POS])


SPEC = DiagnosisSpec(model="/models/tiny-llama", prompts=["hi"], target="vllm", reference="hf", dtype="bfloat16")


@pytest.fixture
def written(tmp_path) -> tuple[Report, dict[str, Path]]:
    report = build_report(_ranking(), spec=SPEC, meta=RunMeta(ekka_version="test"))
    paths = write_report(report, tmp_path / "out" / "nested")
    return report, paths


def _strict_json(text: str):
    def no_constants(name):
        raise ValueError(f"non-standard JSON constant {name} (JavaScript's JSON.parse rejects it)")
    return json.loads(text, parse_constant=no_constants)


# --- report.json ----------------------------------------------------------------------------------------------

def test_files_are_written(written):
    _, paths = written
    assert {p.name for p in paths.values()} == {"report.json", "report.md", "report.html"}
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())


def test_json_follows_the_contract(written):
    report, paths = written
    data = _strict_json(paths["json"].read_text())
    assert data == _strict_json(json.dumps(report.to_json()))
    assert Report.load(paths["json"]) == report          # the file reads back as the report it was written from
    assert data["schema"] == SCHEMA == "ekka.report/1"
    assert data["verdict"] in ("divergent", "consistent", "inputs-differ") and data["verdict"] == "divergent"
    assert [s["rank"] for s in data["suspects"]] == [1, 2]
    top = data["suspects"][0]
    assert top["target"]["module"] == ATTN and top["target"]["class"] == "Attention"
    assert top["target"]["file"].endswith("vllm/attention/layer.py") and top["target"]["line"] == 120
    assert isinstance(top["target"]["line"], int)
    assert top["reference"] == {"modules": ["model.layers.1.self_attn.o_proj"]}
    assert top["error_ratio"] == pytest.approx(30.0) and top["onset_token"] == ONSET
    assert isinstance(top["evidence"], str) and top["evidence"]
    for s in data["suspects"]:
        assert {"rank", "target", "reference", "error_ratio", "onset_token", "evidence"} <= set(s)
        assert {"module", "class", "file", "line"} <= set(s["target"])
        assert isinstance(s["reference"]["modules"], list)


def test_unknown_ratio_is_null_not_nan(written):
    _, paths = written
    data = _strict_json(paths["json"].read_text())     # would raise on NaN
    assert data["suspects"][1]["error_ratio"] is None
    assert data["suspects"][1]["onset_token"] is None


def test_json_carries_spec_checked_count_unchecked_and_notes(written):
    data = _strict_json(written[1]["json"].read_text())
    assert data["spec"]["model"] == SPEC.model and data["spec"]["prompts"] == SPEC.prompts
    assert data["spec"]["target"] == "vllm" and data["spec"]["reference"] == "hf"
    assert data["threshold"] == 2.0 and data["dtype"] == "bfloat16"
    assert data["checked"] == len(_ranking().pairs)
    assert data["unchecked"] == [{"module": "model.layers.0.self_attn.rotary_emb", "reason": "checked through attn"}]
    assert data["notes"] and data["inputs_differ"] == []


def test_plot_data_series_and_heatmap():
    plots = plot_data(_ranking())
    assert [s.component for s in plots.series] == [p.component for p in _ranking().pairs]
    assert plots.change_point == 2 and plots.series[2].component == ATTN
    hm = plots.heatmap
    assert hm.layers == LAYERS                          # decoder layers only, not the attn or logits pairs
    assert hm.positions == list(range(N_POS))
    assert len(hm.ratios) == len(LAYERS) and all(len(row) == N_POS for row in hm.ratios)
    assert hm.ratios[2][ONSET - 1] == pytest.approx(1.0) and hm.ratios[2][ONSET] == pytest.approx(35.0)
    assert hm.ratios[1] == [pytest.approx(50.0)] * N_POS      # max over the two sequences


# --- Markdown -------------------------------------------------------------------------------------------------

def test_markdown_lists_suspects_and_unchecked(written):
    md = written[1]["md"].read_text()
    assert md.startswith("# Ekka report")
    assert headline(written[0]) in md and "divergent" in md
    assert f"`{ATTN}`" in md and "layer.py:120" in md
    assert "rotary_emb" in md and "checked through attn" in md
    assert md.index(ATTN) < md.index("model.layers.1.self_attn`")   # rank order


# --- HTML -----------------------------------------------------------------------------------------------------

class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.heat_rows: list[list[dict]] = []
        self.heat_headers: list[str] = []
        self._in_heat = False
        self._in_th = False
        self._row: list[dict] | None = None
        self.texts: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table" and "heat" in (a.get("class") or ""):
            self._in_heat = True
        elif self._in_heat and tag == "tr":
            self._row = []
        elif self._in_heat and tag == "th":
            self._in_th = True
        elif self._in_heat and tag == "td" and self._row is not None:
            self._row.append(a)

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_heat = False
        elif tag == "th":
            self._in_th = False
        elif tag == "tr" and self._in_heat and self._row is not None:
            self.heat_rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        self.texts.append(data)
        if self._in_heat and self._in_th and data.strip():
            self.heat_headers.append(data.strip())


def _parse(html_text: str) -> _Collector:
    c = _Collector()
    c.feed(html_text)
    return c


def test_html_is_self_contained(written):
    text = written[1]["html"].read_text()
    c = _parse(text)
    for tag, attrs in c.tags:
        for key in ("src", "href", "xlink:href", "data"):
            v = (attrs.get(key) or "").strip().lower()
            assert not v.startswith(("http://", "https://", "//")), (tag, key, v)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert "@import" not in text and "url(http" not in text
    assert not any(tag == "script" and "src" in attrs for tag, attrs in c.tags)


def test_html_has_the_error_ratio_plot_with_the_change_point_marked(written):
    text = written[1]["html"].read_text()
    c = _parse(text)
    assert any(tag == "svg" for tag, _ in c.tags)
    circles = [a for t, a in c.tags if t == "circle"]
    assert len(circles) == len(_ranking().pairs)            # one point per compared pair
    # the change-point marker is a vertical line at the x of the change-point pair's point
    body = "".join(c.texts)
    assert f"change point: {ATTN}" in body
    cp_circle = circles[2]
    dashed = [a for t, a in c.tags if t == "line" and a.get("stroke-dasharray")]
    assert len(dashed) == 1
    assert dashed[0]["x1"] == dashed[0]["x2"]
    assert float(dashed[0]["x1"]) == pytest.approx(float(cp_circle["cx"]), abs=0.11)
    # points above the threshold are drawn in a different colour from those below
    above = {a["fill"] for a, p in zip(circles, _ranking().pairs) if p.error_ratio > 2.0}
    below = {a["fill"] for a, p in zip(circles, _ranking().pairs) if p.error_ratio <= 2.0}
    assert len(above) == 1 and len(below) == 1 and above != below
    # larger ratios are drawn higher (log scale; SVG y grows downwards)
    ys = [float(a["cy"]) for a in circles]
    assert ys[5] < ys[4] < ys[2] < ys[1] < ys[0] + 1e-9


def test_html_has_the_layer_by_position_heat_map(written):
    c = _parse(written[1]["html"].read_text())
    assert c.heat_headers[:len(LAYERS)] == LAYERS
    rows = [r for r in c.heat_rows if len(r) == N_POS]
    assert len(rows) == len(LAYERS)

    def hue(cell: dict) -> int:
        m = re.search(r"background:hsl\((\d+),", cell.get("style", ""))
        assert m, cell
        return int(m.group(1))

    layer2 = rows[2]
    # before the onset the cells are noise (green end), from it on far above threshold (red end)
    assert all(hue(cell) >= 90 for cell in layer2[:ONSET])
    assert all(hue(cell) <= 30 for cell in layer2[ONSET:])
    assert "position 3" in layer2[ONSET]["title"] and "35" in layer2[ONSET]["title"]


def test_html_shows_suspects_escaped(tmp_path):
    r = _ranking()
    r.suspects[0].evidence = "input <script>alert(1)</script> & more"
    r.pairs[1].cls = "Layer<script>alert(2)</script>"      # a class name reaches the plot's tooltips
    text = write_report(build_report(r, spec=SPEC, meta=RunMeta()), tmp_path)["html"].read_text()
    assert f"<code>{ATTN}</code>" in text and "layer.py:120" in text
    assert "<script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in text
    assert f"<title>{LAYERS[0]} (Layer&lt;script&gt;alert(2)&lt;/script&gt;): " in text


# --- other verdicts -------------------------------------------------------------------------------------------

def test_consistent_report(tmp_path):
    r = _ranking()
    r.verdict, r.suspects, r.change_point = "consistent", [], None
    report = build_report(r, spec=SPEC, meta=RunMeta())
    paths = write_report(report, tmp_path)
    data = _strict_json(paths["json"].read_text())
    assert data["verdict"] == "consistent" and data["suspects"] == []
    assert headline(report).startswith("consistent") and str(len(r.pairs)) in headline(report)
    html_text = paths["html"].read_text()
    assert "<svg" in html_text and "change point:" not in html_text
    assert not any(a.get("stroke-dasharray") for t, a in _parse(html_text).tags if t == "line")


def test_inputs_differ_report(tmp_path):
    r = Ranking("inputs-differ", 2.0, "bfloat16",
                inputs_differ=[InputsDiffer(prompt=0, request="0", input="prompt", position=0,
                                            fed_from="the engine's tokenizer", target=[5, 6, 7],
                                            reference=[1, 5, 6, 7])])
    report = build_report(r, spec=SPEC, meta=RunMeta())
    paths = write_report(report, tmp_path)
    data = _strict_json(paths["json"].read_text())
    assert data["verdict"] == "inputs-differ" and data["suspects"] == [] and data["checked"] == 0
    assert data["inputs_differ"][0]["position"] == 0
    assert "inputs-differ" in headline(report)
    md = paths["md"].read_text()
    assert "at token 0" in md and "[1, 5, 6, 7]" in md
    assert "<svg" in paths["html"].read_text()


# --- regression: non-finite ratios break report.json / report.html ------------------------

def test_infinite_ratio_is_reported_as_strict_json_and_html(tmp_path):
    r = _ranking()
    r.pairs[4].error_ratio = float("inf")        # target overflowed to inf: ‖X_T − Y_R‖ = inf
    r.suspects[0].error_ratio = float("inf")
    paths = write_report(build_report(r, spec=SPEC, meta=RunMeta()), tmp_path)
    _strict_json(paths["json"].read_text())
    assert "<svg" in paths["html"].read_text()


# --- what ran: serving, triage, conventions, the agent; and the CLI's summary ------------------------------------

def _served_report() -> Report:
    from ekka_core.contracts.report import AgentSection, AgentUsage, EngineInfo, ServingSection
    from ekka_core.contracts.report import Suspect as ReportSuspect
    from ekka_core.contracts.report import TargetLocation
    from ekka_core.contracts.serving import (ConfigChange, FactorDifference, PositionRatio, SymptomCheck, Trial,
                                             Triage)

    first = PositionRatio(request=1, position=7, ratio=40.0, token_matches_reference=False)
    served = SymptomCheck(label="served", ratio=40.0, diverges=True, threshold=2.0, first=first, cached_tokens=12,
                          positions=[PositionRatio(0, 6, 1.1, True), first], note="two tokens rerouted")
    traced = SymptomCheck(label="traced", ratio=1.05, diverges=False, threshold=2.0,
                          positions=[PositionRatio(0, 6, 1.0, True), PositionRatio(1, 7, 1.1, True)])
    triage = Triage(served=served, baseline=traced,
                    differing={"prefix_caching": FactorDifference(served=True, baseline=False)},
                    ruled_out={"batching": "one request per step"},
                    trials=[Trial(factors=["prefix_caching"], args={}, ratio=38.0, diverges=True, seconds=3.0),
                            Trial(factors=[], args={}, ratio=None, diverges=None, error="engine <crashed>")],
                    culprit=["prefix_caching"], words="prefix caching alone makes the difference",
                    traced_under=["prefix_caching"])
    serving = ServingSection(served_args={"model": "/m", "enable_prefix_caching": True},
                             served_resolved={"compilation_mode": 0, "max_num_seqs": 4}, served=served, traced=traced,
                             changes=[ConfigChange("enforce_eager", None, True, "hooks do not fire under replay")],
                             triage=triage)
    convention = ReportSuspect(rank=3, kind="convention", evidence="rounds <earlier> than the reference",
                               target=TargetLocation(module="model.norm", cls="RMSNorm",
                                                     file="/venv/site-packages/vllm/norm.py", line=9))
    spec = DiagnosisSpec(model="/models/tiny-llama", prompts=["hi", "there"], max_new_tokens=5)
    report = build_report(_ranking(), spec=spec, serving=serving,
                          meta=RunMeta(target=EngineInfo(framework="vllm", version="0.32.0"),
                                       reference=EngineInfo(framework="hf", version="5.19.0",
                                                            attn_implementation="sdpa")),
                          agent=AgentSection(status="complete", message="mapped 2",
                                             usage=AgentUsage(calls=3, dollars=0.0125),
                                             transcript={"markdown": "agent-transcript.md"}))
    report.conventions = [convention]
    report.suspects[0].target.call_file, report.suspects[0].target.call_line = "/venv/site-packages/vllm/llama.py", 77
    return report


def test_serving_triage_conventions_and_agent_are_rendered(tmp_path):
    report = _served_report()
    paths = write_report(report, tmp_path)
    assert Report.load(paths["json"]) == report
    md = paths["md"].read_text()
    assert "**Served configuration** (enable_prefix_caching=True; the engine resolved: compile mode 0" in md
    assert "up to 4 requests per step): **diverges** at the logits level (ratio 40.0, first at request 1 token 7; " \
           "12 prompt tokens from the prefix cache) — two tokens rerouted" in md
    assert "- **Traced configuration**: matches the reference at the logits level (ratio 1.05)" in md
    assert "  - `enforce_eager` = `True` (served: `None`) — hooks do not fire under replay" in md
    assert "prefix caching alone makes the difference" in md and "(False → True)" in md
    assert "ruled out — one request per step" in md
    assert "| baseline + prefix_caching | 38.0 | yes | 3 |" in md
    assert "| baseline + nothing | n/a | engine <crashed> | 0 |" in md
    assert "Culprit: prefix_caching; traced again with prefix_caching as served" in md
    assert "- `model.norm` (RMSNorm, vllm/norm.py:9): rounds <earlier> than the reference" in md
    assert "(called at vllm/llama.py:77)" in md
    assert "- complete: mapped 2" in md and "- 3 API calls, $0.0125" in md and "agent-transcript.md" in md
    text = paths["html"].read_text()
    assert "engine &lt;crashed&gt;" in text and "rounds &lt;earlier&gt;" in text and "<crashed>" not in text
    assert 'aria-label="logits-level ratio per sampled position"' in text
    assert "called at <code>vllm/llama.py:77</code>" in text
    assert "/models/tiny-llama · target vllm 0.32.0 vs reference hf 5.19.0 (sdpa) · bfloat16 · 2 prompt(s), " \
           "5 new tokens" in text


def test_cli_prints_the_report(tmp_path, capsys):
    from ekka_core.cli import _print_report

    report = _served_report()
    paths = write_report(report, tmp_path)
    _print_report(report, paths)
    out = capsys.readouterr().out
    assert headline(report) in " ".join(out.split())
    assert "served configuration: diverges at the logits level (ratio 40.0)" in out
    assert "traced configuration: matches at the logits level (ratio 1.05)" in out
    assert "traced with: enforce_eager=True" in out
    assert "triage (2 configurations tried): prefix caching alone makes the difference" in out
    assert ATTN in out and "called from vllm/llama.py:77" in out and str(paths["json"]) in out


def test_consistent_headline_counts_what_was_compared_and_says_partial_below_the_known_coverage():
    from ekka_core.contracts.report import KNOWN_COVERAGE, Report, Unchecked, coverage_words, headline

    known = Report(verdict="consistent", checked=51, unchecked=[Unchecked("", "model root")])
    words = headline(known)
    assert "on 51 of 52 components; 1 not compared: <root>" in words and "partial" not in words
    qwen2_moe = Report(verdict="consistent", checked=59,
                       unchecked=[Unchecked(f"model.layers.{i}.mlp.experts", "why") for i in range(13)])
    assert 59 / 72 < KNOWN_COVERAGE
    words = coverage_words(qwen2_moe)
    assert words.startswith("59 of 72 components; 13 not compared: model.layers.0.mlp.experts")
    assert "and 10 more" in words and "partial: 82% compared" in words
