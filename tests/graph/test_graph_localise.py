"""In-graph localisation of compile-only divergences: splitting a Dynamo graph along module boundaries, scoring each
piece compiled vs eager, and naming the compiler stage — on real HF zoo models compiled by real Inductor, with the
two compile-only bug classes injected the way they happen: a wrong Inductor decomposition of one op, and a wrong
rewrite in a custom post-grad (fusion) pass."""

from __future__ import annotations

import pytest
import torch

from ekka_core.graph import localise_in_graph
from ekka_core.graph.capture import dynamo_graph
from ekka_core.graph.pieces import by_module, split_by_module
from ekka_core.graph.replay import in_wider, outputs, piece_inputs, truth_dtype

aten = torch.ops.aten
PROMPT = torch.arange(1, 25)[None]


def _model(zoo_model, arch: str = "llama", **overrides):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(zoo_model(arch, **overrides), dtype=torch.bfloat16,
                                                attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def llama_graph(zoo_model):
    return dynamo_graph(_model(zoo_model).model, input_ids=PROMPT)


def test_split_follows_decoder_layers_then_their_children_and_computes_the_same(llama_graph, zoo_model):
    gm, inputs = llama_graph
    split = split_by_module(gm, by_module(0))
    modules = [p.module for p in split.pieces]
    layers = _model(zoo_model).config.num_hidden_layers
    assert modules[0] == "embed_tokens" and modules[-1] == "norm"
    assert [m for m in modules if m.startswith("layers.")] == [f"layers.{i}" for i in range(layers)]
    assert {p.module_class for p in split.pieces if p.module.startswith("layers.")} == {"LlamaDecoderLayer"}

    fed = piece_inputs(split, inputs)
    layer = split.pieces[modules.index("layers.1")]
    children = split_by_module(layer.graph, by_module(1, within="layers.1"))
    named = [p.module for p in children.pieces]
    for child in ("layers.1.input_layernorm", "layers.1.self_attn", "layers.1.post_attention_layernorm",
                  "layers.1.mlp"):
        assert child in named
    with torch.no_grad():
        whole = outputs(gm(*inputs))
        pieced = outputs(split.graph(*inputs))
        layer_alone = outputs(layer.graph(*fed[layer.submodule]))
        layer_by_children = outputs(children.graph(*fed[layer.submodule]))
    assert all(torch.equal(a, b) for a, b in zip(whole, pieced))
    assert all(torch.equal(a, b) for a, b in zip(layer_alone, layer_by_children))


def test_the_wider_twin_does_not_round_to_the_low_precision(llama_graph):
    gm, inputs = llama_graph
    split = split_by_module(gm, by_module(0))
    norm = next(p for p in split.pieces if p.module == "norm")
    fed = piece_inputs(split, inputs)[norm.submodule]
    with torch.no_grad():
        low = outputs(norm.graph(*fed))[0]
        wide = outputs(in_wider(norm.graph, truth_dtype("bfloat16"))(*[x.float() if x.is_floating_point() else x
                                                                         for x in fed]))[0]
    assert low.dtype == torch.bfloat16 and wide.dtype == torch.float32
    # The norm's own ``.to(input_dtype)`` would round its output to bf16: in the twin it does not.
    assert not torch.equal(wide, wide.to(torch.bfloat16).float())


def test_a_graph_that_cannot_be_replayed_is_said_so_never_consistent(llama_graph):
    gm, inputs = llama_graph
    result = localise_in_graph(gm, inputs[:1], dtype="bfloat16")     # the graph's other inputs are missing
    assert not result.replayable and not result.departs
    assert "could not be split and replayed" in result.reason


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_clean_compiled_graphs_agree_with_their_eager_run(zoo_model, arch):
    gm, inputs = dynamo_graph(_model(zoo_model, arch).model, input_ids=PROMPT)
    result = localise_in_graph(gm, inputs, dtype="bfloat16")
    assert result.replayable and not result.departs, result.pieces
    assert any(p.module.startswith("layers.") for p in result.pieces)
    assert all(p.error_ratio <= result.threshold for p in result.pieces)


@pytest.mark.slow
def test_a_wrong_decomposition_is_found_in_the_mlp_at_its_source_line_and_named(llama_graph, monkeypatch):
    import torch._inductor.decomposition as decomposition

    gm, inputs = llama_graph
    # SiLU decomposed with quick-GELU's sigmoid scale: the kind of one-op slip a decomposition table takes silently.
    # Inductor reads a cached merge of its tables (``fast_random_decomps``): it is cleared on both sides of the test.
    monkeypatch.setitem(decomposition.decompositions, aten.silu.default, lambda x: x * torch.sigmoid(1.702 * x))
    decomposition.fast_random_decomps.cache_clear()
    try:
        result = localise_in_graph(gm, inputs, dtype="bfloat16")
    finally:
        monkeypatch.undo()
        decomposition.fast_random_decomps.cache_clear()
    assert result.departs and result.suspect.module == "layers.0.mlp"
    assert result.pieces[-1].module == "layers.0" and result.pieces[-1].departs
    assert all(not p.departs for p in result.pieces[:-1])
    silu = [n for n in result.suspect_nodes if n.op == "silu"]
    assert silu and silu[0].file.endswith("transformers/activations.py") and "silu" in silu[0].code
    assert result.passes[0].stage == "decomposition" and result.passes[0].name == "aten.silu.default"


@pytest.mark.slow
def test_a_wrong_fusion_pass_is_named_with_the_line_it_rewrote(llama_graph):
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class FusedAddNormWrongOperand(CustomGraphPass):
        """A fused add + RMSNorm rewrite that normalises one operand of the residual add instead of the sum."""

        def __call__(self, graph):
            for node in graph.nodes:
                if node.op == "call_function" and node.target is aten.pow.Tensor_Scalar:
                    src = node.args[0]
                    while src.op == "call_function" and src.target is torch.ops.prims.convert_element_type.default:
                        src = src.args[0]
                    if src.op == "call_function" and src.target is aten.add.Tensor:
                        node.replace_input_with(node.args[0], src.args[0])
                        return

        def uuid(self):
            return "ekka-test-wrong-fused-add-norm"

    gm, inputs = llama_graph
    result = localise_in_graph(gm, inputs, dtype="bfloat16",
                               config_patches={"post_grad_custom_post_pass": FusedAddNormWrongOperand()})
    assert result.departs and result.suspect.module == "layers.0"
    assert result.passes[0].stage == "post-grad pass" and result.passes[0].name == "FusedAddNormWrongOperand"
    assert "rewrote" in result.node_words
    lines = {(n.module, n.line) for n in result.suspect_nodes}
    assert any(m == "layers.0.post_attention_layernorm" for m, _ in lines), lines
    assert all("pow(2)" in n.code for n in result.suspect_nodes), result.suspect_nodes
