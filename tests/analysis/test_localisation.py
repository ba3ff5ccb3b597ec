"""The analysis stage: where an error is introduced — a module, the code a parent's forward runs between two
children, or a departure from the reference's own rounding — and evidence sentences that say what their numbers say.

Hand-made aligned pairs on one clock: each pair's output at its completion index, its input (where compared) just
after the call that completed before its module started (``entered``)."""

from __future__ import annotations

import re

import pytest
import torch

from ekka_core.analysis import CONVENTION_CLOSER, CONVENTION_DISTANCE, analyse
from ekka_core.mapping import ComponentPair, Endpoint
from hand_made import HandAligned, HandPairs

THR = 2.0


@pytest.fixture(autouse=True)
def noise_model(monkeypatch):
    """A noise model for the hand-made classes: norms are bit-identical when clean, composites are not."""
    from ekka_core.analysis import conventions

    model = {"classes": {"Input_Layernorm": 0.0, "Post_Attention_Layernorm": 0.0, "0": 1.0, "Mlp": 1.0},
             "glue": 0.0}
    monkeypatch.setattr(conventions, "convention_noise", lambda: model)
    return model


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _triple(seed: int, err: float = 1.0, shape: tuple = (12, 64)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X_T, X_R, Y_R) with the target ``err`` times as far from fp32 as the reference (independent noise)."""
    y = torch.randn(shape, generator=_g(seed))
    x_r = y + 0.01 * torch.randn(shape, generator=_g(seed + 1))
    x_t = y + 0.01 * err * torch.randn(shape, generator=_g(seed + 2))
    return x_t, x_r, y


# A decoder-like execution: (module, entered_after, input compared?). Completion order is the list order.
MODEL = [
    ("model.embed_tokens", -1, False),
    ("model.layers.0.input_layernorm", 0, True),
    ("model.layers.0.self_attn.qkv_proj", 1, True),
    ("model.layers.0.self_attn.attn", 2, False),
    ("model.layers.0.self_attn.o_proj", 3, True),
    ("model.layers.0.self_attn", 1, False),
    ("model.layers.0.post_attention_layernorm", 5, True),
    ("model.layers.0.mlp", 6, True),
    ("model.layers.0", 0, True),
    ("model.layers.1.input_layernorm", 8, True),
    ("model.layers.1.mlp", 9, True),
    ("model.layers.1", 8, True),
    ("model.norm", 11, True),
    ("logits_processor", 12, False),
]


def _model(errors: dict[str, float], input_errors: dict[str, float], *, identical_inputs: set[str] = frozenset(),
           closer: set[str] = frozenset()) -> tuple[HandPairs, dict, dict]:
    """Every pair noise-level (ratio ≈ 1) unless ``errors`` / ``input_errors`` lift its output / input ratio.
    ``identical_inputs``: target and X_R fed the very same tensor. ``closer``: the output equals fp32 plus a tenth of
    the reference's error, i.e. it departs from X_R by the reference's own rounding and is closer to fp32."""
    items, classes, entered = [], {}, {}
    for order, (name, after, has_input) in enumerate(MODEL):
        x_t, x_r, y = _triple(10 * order, errors.get(name, 1.0))
        if name in closer:
            x_t = y + 0.1 * (x_r - y)
        inputs = None
        if has_input:
            i_t, i_r, i_y = _triple(1000 + 10 * order, input_errors.get(name, 1.0))
            if name in identical_inputs:
                i_t = i_r.clone()
            inputs = (i_t, i_r, i_y)
        pair = ComponentPair(name, "1:1", "same-path", Endpoint([name]), Endpoint([name]),
                             compare_inputs=has_input)
        items.append(HandAligned(pair, order, [(0, p) for p in range(12)], x_t, x_r, y, inputs))
        entered[name] = after
        classes[name] = {"cls": name.rsplit(".", 1)[-1].title(), "file": f"/src/{name}.py", "line": 10 + order,
                         "forward_file": f"/src/{name}.py", "forward_line": 20 + order, "qualname": f"m.{name}"}
    classes["model"] = {"cls": "LlamaModel", "file": "/src/llama.py", "line": 300, "forward_file": "/src/llama.py",
                        "forward_line": 350, "qualname": "m.LlamaModel"}
    return HandPairs(items), classes, entered


def _locate(owner: str, child_from: str, child_to: str):
    spans = {("model", "embed_tokens", "layers"): ("/src/llama.py", 362, 370),
             ("model.layers.0", "self_attn", "post_attention_layernorm"): ("/src/model.layers.0.py", 41, 44)}
    return spans.get((owner, child_from, child_to))


def _analyse(aligned, classes, entered):
    return analyse(aligned, threshold=THR, dtype="bfloat16", target_classes=classes, prompt_lens=[12],
                   entered=entered, locate=_locate)


def _module_bug(name: str, err: float) -> tuple[dict, dict]:
    """``name`` computes wrongly: its output and every later output carry the error; so does the input of every
    module entered after it completed (its own input agrees)."""
    names = [m for m, _, _ in MODEL]
    at = names.index(name)
    outputs = {m: err for m in names[at:]}
    inputs = {m: err for m, after, _ in MODEL if after >= at}
    return outputs, inputs


def _glue_bug(before: str, err: float, *, invariant: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """A parent's forward corrupts the data just before ``before`` starts: the input of every module entered from
    then on departs, and every later output — except those of scale-invariant modules in ``invariant``."""
    names = [m for m, _, _ in MODEL]
    entered = dict((m, after) for m, after, _ in MODEL)
    inputs = {m: err for m, after, _ in MODEL if after >= entered[before]}
    outputs = {m: err for m in names[names.index(before):] if m not in invariant}
    return outputs, inputs


def test_parent_forward_bug_between_embedding_and_first_layer_names_the_parent_and_its_lines():
    # The model's forward scales the embeddings wrongly before layer 0: every input from layer 0 on departs, the
    # first RMSNorm's output does not (scale-invariant), and the first red *output* is far downstream.
    # (the norm's output agrees, so does everything attention computes from it; the residual carries it on)
    invariant = ("model.layers.0.input_layernorm", "model.layers.0.self_attn.qkv_proj",
                 "model.layers.0.self_attn.attn", "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn")
    outputs, inputs = _glue_bug("model.layers.0.input_layernorm", 40.0, invariant=invariant)
    for m in invariant[1:]:
        inputs.pop(m, None)
    r = _analyse(*_model(outputs, inputs))
    top = r.suspects[0]
    assert r.verdict == "divergent"
    assert top.kind == "glue" and top.module == "model" and top.cls == "LlamaModel"
    assert top.between == ["model.embed_tokens", "model.layers.0"]
    assert top.lines == [362, 370] and top.forward_file == "/src/llama.py"
    assert "agrees" in top.evidence and "already departs" in top.evidence and "llama.py:362–370" in top.evidence


def test_residual_added_wrongly_in_a_decoder_layer_names_the_layer_between_attention_and_its_norm():
    outputs, inputs = _glue_bug("model.layers.0.post_attention_layernorm", 25.0)
    r = _analyse(*_model(outputs, inputs))
    top = r.suspects[0]
    assert top.kind == "glue" and top.module == "model.layers.0"
    assert top.between[1] == "model.layers.0.post_attention_layernorm"
    assert top.lines == [41, 44]


def test_module_bug_with_an_agreeing_input_is_the_module_itself():
    outputs, inputs = _module_bug("model.layers.0.mlp", 30.0)
    r = _analyse(*_model(outputs, inputs))
    assert r.suspects[0].kind == "module" and r.suspects[0].module == "model.layers.0.mlp"
    assert "its input agrees with the reference (input ratio" in r.suspects[0].evidence


def test_clean_run_is_consistent_and_has_no_convention_finding():
    r = _analyse(*_model({}, {}, identical_inputs={"model.layers.0.input_layernorm"}))
    assert r.verdict == "consistent" and r.suspects == [] and r.conventions == []


def test_output_closer_to_fp32_than_the_reference_on_identical_inputs_is_a_convention_finding():
    r = _analyse(*_model({}, {}, identical_inputs={"model.layers.0.input_layernorm"},
                         closer={"model.layers.0.input_layernorm"}))
    assert r.verdict == "consistent"          # ratio-level: nothing (the pipeline decides the verdict)
    (c,) = r.conventions
    assert c.kind == "convention" and c.module == "model.layers.0.input_layernorm"
    assert c.same_dtype >= CONVENTION_DISTANCE and c.error_ratio <= CONVENTION_CLOSER
    assert "closer to fp32 than the reference" in c.evidence


def test_a_class_without_a_noise_model_gets_no_convention_claim(noise_model):
    del noise_model["classes"]["Input_Layernorm"]
    r = _analyse(*_model({}, {}, identical_inputs={"model.layers.0.input_layernorm"},
                         closer={"model.layers.0.input_layernorm"}))
    assert r.conventions == []


def test_a_class_that_is_noisy_when_clean_needs_a_larger_departure(noise_model):
    noise_model["classes"]["Input_Layernorm"] = 0.5     # clean runs reach 0.5: 4x that is needed, 0.9 is not enough
    r = _analyse(*_model({}, {}, identical_inputs={"model.layers.0.input_layernorm"},
                         closer={"model.layers.0.input_layernorm"}))
    assert r.conventions == []


def test_closer_output_without_identical_inputs_is_not_a_convention_finding():
    # Inputs that already differ explain an output that differs: no claim about rounding conventions.
    r = _analyse(*_model({}, {}, closer={"model.layers.0.input_layernorm"}))
    assert r.conventions == []


# --- evidence never contradicts its numbers ---------------------------------------------------------------------

CLAIM = re.compile(r"(agrees|departs)(?! from the reference's \w+ rounding)[^;()]*?\((?:[a-z ]*?)ratio (\d+(?:\.\d+)?)")
CONVENTION = re.compile(r"departs from the reference's \w+ rounding.*?differs from that run by (\d+(?:\.\d+)?)×.*?"
                        r"closer to fp32 than the reference \(error ratio (\d+(?:\.\d+)?)\)")


STATED = re.compile(r"output error ratio (\d+(?:\.\d+)?) \(threshold")     # a suspect's own ratio: above it


def _claims(text: str) -> list[tuple[str, float]]:
    out = [(m.group(1), float(m.group(2))) for m in CLAIM.finditer(text)]
    out += [("departs", float(m.group(1))) for m in STATED.finditer(text)]
    for m in CONVENTION.finditer(text):
        out += [("rounding-distance", float(m.group(1))), ("closer-ratio", float(m.group(2)))]
    return out


def _every_kind() -> list:
    reports = []
    # module (input agrees), module (no input: the observation before it), glue (model), glue (layer), enclosing
    reports.append(_analyse(*_model(*_module_bug("model.layers.0.mlp", 30.0))))
    reports.append(_analyse(*_model(*_module_bug("model.layers.0.self_attn.attn", 30.0))))
    reports.append(_analyse(*_model(*_glue_bug("model.layers.0.post_attention_layernorm", 25.0))))
    # no module introduces it: the change point's input already departs (the fallback sentence)
    everything = {k: 30.0 for k, _, _ in MODEL}
    reports.append(_analyse(*_model(everything, dict(everything))))
    reports.append(_analyse(*_model({}, {}, identical_inputs={"model.layers.0.input_layernorm"},
                                    closer={"model.layers.0.input_layernorm"})))
    return reports


def test_the_fixture_covers_every_suspect_kind():
    kinds = {s.kind for r in _every_kind() for s in r.suspects + r.conventions}
    assert kinds == {"module", "glue", "convention"}
    evidences = " ".join(s.evidence for r in _every_kind() for s in r.suspects)
    assert "encloses" in evidences and "already departs" in evidences


@pytest.mark.parametrize("index", range(5))
def test_no_evidence_sentence_contradicts_its_numbers(index):
    report = _every_kind()[index]
    for s in report.suspects + report.conventions:
        claims = _claims(s.evidence)
        assert claims or "not compared itself" in s.evidence, f"{s.module}: states no number: {s.evidence}"
        for word, value in claims:
            if word == "agrees":
                assert value <= THR, f"{s.module}: claims agreement with ratio {value}"
            elif word == "departs":
                assert value > THR, f"{s.module}: claims a departure with ratio {value}"
            elif word == "rounding-distance":
                assert value >= CONVENTION_DISTANCE, f"{s.module}: a rounding departure of only {value}"
            else:
                assert value <= CONVENTION_CLOSER, f"{s.module}: 'closer to fp32' with ratio {value}"


def test_the_checker_catches_a_contradiction():
    assert _claims("while its input agrees with the reference (ratio 299.08)") == [("agrees", 299.08)]
    assert _claims("the input of x already departs (input ratio 1.2, threshold 2.0)") == [("departs", 1.2)]
    text = ("departs from the reference's bfloat16 rounding: fed the same input (input distance 0.00), its output "
            "differs from that run by 0.20× the reference's own rounding error, and is closer to fp32 than the "
            "reference (error ratio 0.90)")
    assert _claims(text) == [("rounding-distance", 0.2), ("closer-ratio", 0.9)]
