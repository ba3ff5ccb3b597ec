"""The report says what the comparison read off the run's own tensors instead of a declaration."""

from types import SimpleNamespace

from ekka_core.checks.modules import read_off_the_trace
from ekka_core.mapping import ComponentPair, Endpoint, Mapping


def _mapping(subtract: bool) -> Mapping:
    m = Mapping("vllm", "hf")
    m.pairs.append(ComponentPair("transformer.h.0.mlp", "1:1", "same-weights", Endpoint(["transformer.h.0.mlp"]),
                                 Endpoint(["transformer.h.0.mlp"], minus_input=1 if subtract else None)))
    return m


def test_nothing_read_off_the_trace_says_nothing():
    assert read_off_the_trace(_mapping(False), SimpleNamespace(stream_summed=True, embedding_scale=None)) == []


def test_stream_convention_embedding_scale_and_subtracted_residuals_are_each_said():
    notes = read_off_the_trace(_mapping(True), SimpleNamespace(stream_summed=False,
                                                               embedding_scale=("model.embed_tokens", 12.0)))
    assert len(notes) == 3
    assert "return the residual stream itself" in notes[0]
    assert "model.embed_tokens by 12" in notes[1] and "measured" in notes[1]
    assert "residual added inside the block" in notes[2] and "on 1 pairs — transformer.h.0.mlp" in notes[2]
