"""Static Model Tree (ekka_core/tree/static/): libcst parsing of model sources without importing them.

Real sources: the installed vLLM and HF Transformers llama files, and SGLang's llama/qwen2 files fetched from the
sglang wheel by scripts/fetch_sglang_sources.sh (cached under .ekka-cache/sglang-src; sglang is never installed).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from ekka_core.contracts.errors import BadInput
from ekka_core.tree.static import StaticIndex, line_table, locate_source_of, module_name_for, parse_module_source

REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH = REPO_ROOT / "scripts" / "fetch_sglang_sources.sh"
SGLANG_VERSION = os.environ.get("EKKA_SGLANG_VERSION", "0.5.23")


def _package_dir(name: str) -> Path:
    """A top-level package's directory via find_spec, which does not run the package's code."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"{name} is not installed in this environment (scripts/setup.sh installs it)")
    return Path(list(spec.submodule_search_locations)[0])


def _order(calls, *names) -> list[int]:
    """Index of the first call of each name; fails with the call list when one is missing."""
    seen = [c.name for c in calls]
    out = []
    for n in names:
        assert n in seen, f"{n!r} not called; calls: {seen}"
        out.append(seen.index(n))
    return out


def _line(path: str | Path, line: int) -> str:
    return Path(path).read_text(encoding="utf-8").splitlines()[line - 1]


# ---------------------------------------------------------------------------------------------------------------
# A small synthetic file pins the semantics exactly, whatever version of vLLM/SGLang is installed.

SYNTH = '''\
import torch
from torch import nn
from .layers import QKVParallelLinear, RowParallelLinear, Attention, EncoderOnlyAttention
from ..utils import make_layers as make_layers


def apply_rope(q, k):
    return q, k


def deco(cls):
    return cls


class Attn(nn.Module):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    scale: float = 0.5
    mapper = WeightsMapper(orig={".q_proj": (".qkv_proj", "q")}, n=2)

    def __init__(self, cfg, encoder: bool = False):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(8, 8)
        attn_cls = EncoderOnlyAttention if encoder else Attention
        self.attn = attn_cls(4)
        self._init_out(cfg)
        self.num_heads = max(1, cfg.heads)
        self.flags = ["a", "b"]

    def _init_out(self, cfg):
        self.o_proj = RowParallelLinear(8, 8)

    def prepare(self, x):
        qkv = self.qkv_proj(x)
        q, k = apply_rope(qkv.chunk(2)[0], qkv)
        return q, k

    def forward(self, x):
        q, k = self.prepare(x)
        if q is None:
            q = torch.zeros_like(k)
        out = self.o_proj(self.attn(q, k))
        return out.view(-1)

    def load_weights(self, weights):
        stacked_params_mapping = [
            (".qkv_proj", ".q_proj", "q"),
            (".qkv_proj", ".k_proj", "k"),
        ]
        return stacked_params_mapping


@deco
class Model(nn.Module):
    def __init__(self, n, layer_type=Attn):
        super().__init__()
        self.start_layer, self.end_layer, self.layers = make_layers(n, lambda prefix: layer_type(None), prefix="x")
        self.blocks = nn.ModuleList([Attn(None) for _ in range(n)])
        self.head = self._make_head()
        self.tied = self.head
        self.scale = nn.Parameter(torch.ones(1))

    def _make_head(self):
        return RowParallelLinear(8, 8)

    def forward(self, x):
        for i, layer in enumerate(self.layers[self.start_layer:self.end_layer]):
            x = layer(x)
        for j in range(len(self.blocks)):
            x = self.blocks[j](x)
        return self.head(x)


class SubModel(Model):
    pass
'''


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    pkg = tmp_path_factory.mktemp("synth") / "pkg"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    path = pkg / "models" / "toy.py"
    path.write_text(SYNTH)
    return path


def test_synthetic_module_semantics(synth: Path) -> None:
    mod = parse_module_source(synth)
    assert mod.module == "pkg.models.toy"                  # from the __init__.py chain
    assert mod.functions == {"apply_rope": 7, "deco": 11}
    assert mod.imports["QKVParallelLinear"] == "pkg.models.layers.QKVParallelLinear"   # relative import resolved
    assert mod.imports["make_layers"] == "pkg.utils.make_layers"
    assert mod.imports["nn"] == "torch.nn"

    attn = mod.classes["Attn"]
    assert (attn.line, attn.bases) == (15, ["nn.Module"])
    assert attn.literal("packed_modules_mapping") == {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert attn.literal("scale") == 0.5
    assert attn.literal("mapper") == {"call": "WeightsMapper", "args": [],
                                      "kwargs": {"orig": {".q_proj": (".qkv_proj", "q")}, "n": 2}}
    assert attn.literal("stacked_params_mapping") == [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k")]
    local = next(a for a in attn.attributes if a.name == "stacked_params_mapping")
    assert (local.scope, local.method, local.line) == ("local", "load_weights", 45)
    assert attn.literal("flags", scope="instance") == ["a", "b"]

    subs = attn.submodules
    assert list(subs) == ["qkv_proj", "attn", "o_proj"]     # num_heads = max(...) is a builtin, not a submodule
    assert (subs["qkv_proj"].constructor, subs["qkv_proj"].kind, subs["qkv_proj"].line) == \
        ("QKVParallelLinear", "class", 22)
    assert subs["qkv_proj"].qualname == "pkg.models.layers.QKVParallelLinear"
    assert (subs["attn"].constructor, subs["attn"].candidates, subs["attn"].via) == \
        ("EncoderOnlyAttention", ["Attention"], "attn_cls")
    assert (subs["o_proj"].method, subs["o_proj"].line) == ("_init_out", 30)   # a helper __init__ calls

    # forward: the helper's calls are inlined (via), arguments' calls come before the call that takes them,
    # tensor methods (.chunk, .view) are skipped, calls under ``if`` are conditional.
    got = [(c.text(), c.line, c.kind, c.via, c.conditional) for c in attn.forward_calls]
    assert got == [
        ("self.prepare", 38, "method", None, False),
        ("self.qkv_proj", 33, "submodule", "prepare", False),
        ("apply_rope", 34, "function", "prepare", False),
        ("torch.zeros_like", 40, "function", None, True),
        ("self.attn", 41, "submodule", None, False),
        ("self.o_proj", 41, "submodule", None, False),
    ]
    assert attn.forward_line == 37

    model = mod.classes["Model"]
    assert (model.first_line, model.line, model.decorators) == (52, 53, ["deco"])
    msubs = model.submodules
    assert (msubs["layers"].kind, msubs["layers"].constructor, msubs["layers"].element) == \
        ("list", "make_layers", "Attn")                      # lambda → parameter default
    assert "start_layer" not in msubs and "end_layer" not in msubs
    assert (msubs["blocks"].kind, msubs["blocks"].element) == ("list", "Attn")
    assert (msubs["head"].constructor, msubs["head"].via) == ("RowParallelLinear", "_make_head")
    assert (msubs["tied"].kind, msubs["tied"].constructor) == ("alias", "head")
    assert msubs["scale"].kind == "parameter"
    calls = [(c.name, c.alias, c.in_loop) for c in model.forward_calls if c.receiver == "self"]
    assert calls == [("layers", "layer", True), ("blocks", None, True), ("head", None, False)]


def test_index_lookup_inheritance_and_source(synth: Path) -> None:
    index = StaticIndex.from_files([synth])
    assert index.get_class("pkg.models.toy.Attn") is index.get_class("Attn")
    assert index.get_class("Nope") is None
    # SubModel has no forward of its own: the index follows the base class
    assert [c.name for c in index.mro("SubModel")] == ["SubModel", "Model"]
    assert index.find_forward_call_line("SubModel", "head") == 70
    assert "layers" in index.submodules("SubModel")
    assert index.find_forward_call_line("Attn", "qkv_proj") == 33        # inside the helper forward calls
    assert index.find_forward_call_line("Attn", "rotary_emb") is None

    src = index.class_source("Model")
    lines = SYNTH.splitlines(keepends=True)
    assert src == "".join(lines[51:70])                                   # decorator through the last line
    assert src.startswith("@deco\nclass Model(nn.Module):") and src.rstrip().endswith("return self.head(x)")
    with pytest.raises(BadInput, match="Nope"):
        index.class_source("Nope")

    attn = index.get_class("Attn")
    assert (attn.submodules["qkv_proj"].constructor, attn.submodules["qkv_proj"].line) == ("QKVParallelLinear", 22)
    assert attn.forward_line == 37
    sub = attn.submodules["attn"]
    assert (sub.via, sub.constructor, sub.candidates, sub.line) == ("attn_cls", "EncoderOnlyAttention", ["Attention"], 24)


def test_syntax_error_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken_model.py"
    bad.write_text("class A:\n    def forward(self:\n        pass\n")
    with pytest.raises(BadInput) as info:
        parse_module_source(bad)
    assert str(bad) in str(info.value) and "line" in str(info.value)
    assert info.value.exit_code == 2
    with pytest.raises(BadInput, match="no such source file"):
        parse_module_source(tmp_path / "missing.py")

    (tmp_path / "good.py").write_text("class B:\n    x = 1\n")
    files = sorted(tmp_path.glob("*.py"))
    with pytest.raises(BadInput, match="broken_model.py"):
        StaticIndex.from_files(files)
    index = StaticIndex.from_files(files, on_error="skip")
    assert index.get_class("B").literal("x") == 1
    assert list(index.errors) == [str(bad)]


# ---------------------------------------------------------------------------------------------------------------
# vLLM (installed; located through find_spec, never imported)

@pytest.fixture(scope="module")
def vllm_llama() -> Path:
    path = _package_dir("vllm") / "model_executor" / "models" / "llama.py"
    assert path.is_file(), path
    return path


def test_vllm_llama(vllm_llama: Path) -> None:
    assert locate_source_of("vllm.model_executor.models.llama") == vllm_llama
    index = StaticIndex.from_files([vllm_llama])
    mod = index.modules[str(vllm_llama)]
    assert mod.module == "vllm.model_executor.models.llama"

    attn = index.get_class("LlamaAttention")
    assert _line(vllm_llama, attn.line).startswith("class LlamaAttention")
    assert _line(vllm_llama, attn.forward_line).lstrip().startswith("def forward")
    subs = attn.submodules
    assert {"qkv_proj", "o_proj", "rotary_emb", "attn"} <= set(subs)
    assert (subs["qkv_proj"].constructor, subs["qkv_proj"].kind) == ("QKVParallelLinear", "class")
    assert subs["qkv_proj"].qualname == "vllm.model_executor.layers.linear.QKVParallelLinear"
    assert subs["o_proj"].constructor == "RowParallelLinear"
    assert subs["rotary_emb"].constructor == "get_rope"         # assigned in _init_rotary_emb, called by __init__
    assert {subs["attn"].constructor, *subs["attn"].candidates} >= {"Attention"}
    assert _line(vllm_llama, subs["qkv_proj"].line).strip().startswith("self.qkv_proj = QKVParallelLinear(")

    calls = [c for c in attn.forward_calls if c.receiver == "self"]
    i_qkv, i_rope, i_attn, i_o = _order(calls, "qkv_proj", "rotary_emb", "attn", "o_proj")
    assert i_qkv < i_rope < i_attn < i_o
    assert all(c.kind == "submodule" for c in calls)
    line = index.find_forward_call_line("LlamaAttention", "qkv_proj")
    assert line is not None and "self.qkv_proj(" in _line(vllm_llama, line)
    assert attn.forward_line < line <= attn.end_line

    # packed_modules_mapping, checked against the file itself through Python's own ast
    expected = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    causal = index.get_class("LlamaForCausalLM")
    assert causal.literal("packed_modules_mapping") == expected
    tree = ast.parse(vllm_llama.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LlamaForCausalLM")
    stmt = next(s for s in node.body if isinstance(s, ast.Assign)
                and getattr(s.targets[0], "id", None) == "packed_modules_mapping")
    assert ast.literal_eval(stmt.value) == expected
    assert causal.submodules["model"].constructor == "LlamaModel"          # through self._init_model(...)

    model = index.get_class("LlamaModel")
    assert (model.submodules["layers"].kind, model.submodules["layers"].element) == ("list", "LlamaDecoderLayer")
    assert index.find_forward_call("LlamaModel", "layers").alias == "layer"
    mapper = model.literal("hf_to_vllm_mapper")                            # a constructor with its literals
    assert mapper["call"] == "WeightsMapper" and mapper["kwargs"]

    # every class line equals Python's ast; class source is the exact decorator..end slice
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            c = mod.classes[n.name]
            assert c.line == n.lineno, n.name
            first = min([d.lineno for d in n.decorator_list] or [n.lineno])
            want = "".join(vllm_llama.read_text(encoding="utf-8").splitlines(keepends=True)[first - 1:n.end_lineno])
            assert index.class_source(n.name) == want, n.name


@pytest.mark.parametrize("which", ["vllm", "transformers"])
def test_line_provider_matches_position_provider(which: str, vllm_llama: Path) -> None:
    """The lean line pass gives libcst PositionProvider's start line for every node it records."""
    path = vllm_llama if which == "vllm" else locate_source_of("transformers.models.llama.modeling_llama")
    module = cst.parse_module(path.read_bytes())
    fast = line_table(module)
    slow = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    kinds: dict[str, int] = {}
    for node, (start, _) in fast.items():
        assert start == slow[node].start.line, (type(node).__name__, start, slow[node].start.line)
        kinds[type(node).__name__] = kinds.get(type(node).__name__, 0) + 1
    assert kinds.get("Call", 0) >= 50 and kinds.get("ClassDef", 0) >= 5 and kinds.get("FunctionDef", 0) >= 10


@pytest.mark.parametrize("which", ["vllm", "transformers"])
def test_the_public_position_provider_fallback_parses_the_same(which: str, vllm_llama: Path, monkeypatch) -> None:
    """Should libcst lose the internals the lean pass uses, line_table falls back to PositionProvider: the parse
    (every class's and method's lines, every call line) must come out the same."""
    from ekka_core.tree.static import lines

    path = vllm_llama if which == "vllm" else locate_source_of("transformers.models.llama.modeling_llama")
    module = cst.parse_module(path.read_bytes())
    assert lines.LEAN and line_table(module, lean=False) == line_table(module)

    def shape(mod):
        return {name: (c.line, c.end_line, c.first_line,
                       {m.name: (m.line, m.end_line, [x.line for x in m.calls]) for m in c.methods.values()},
                       [(x.name, x.line) for x in c.forward_calls], {k: v.line for k, v in c.submodules.items()})
                for name, c in mod.classes.items()}

    lean = shape(parse_module_source(path))
    monkeypatch.setattr(lines, "LEAN", False)
    assert shape(parse_module_source(path)) == lean


def test_finding_and_parsing_import_nothing(vllm_llama: Path) -> None:
    """find_spec on the top-level name plus parsing must not import vllm, transformers or sglang."""
    code = textwrap.dedent("""
        import importlib.util, sys
        from ekka_core.tree import static
        before = set(sys.modules)
        loc = importlib.util.find_spec("vllm").submodule_search_locations
        path = static.locate_source_of("vllm.model_executor.models.llama")
        static.StaticIndex.from_files([path]).get_class("LlamaAttention")
        static.locate_source_of("transformers.models.llama.modeling_llama")
        new = sorted(m for m in set(sys.modules) - before
                     if m.split(".")[0] in ("vllm", "transformers", "sglang", "torch"))
        print(new)
        assert not new, new
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "[]"


def test_lazy_index_over_vllm_models_dir(vllm_llama: Path) -> None:
    models = vllm_llama.parent
    index = StaticIndex.from_files(sorted(models.glob("*.py")), lazy=True)
    assert index.modules == {}                                  # nothing parsed until asked
    qwen = index.get_class("Qwen2Attention")
    assert qwen is not None and Path(qwen.file).name == "qwen2.py"
    assert len(index.modules) <= 3
    assert index.get_class("vllm.model_executor.models.llama.LlamaMLP").name == "LlamaMLP"
    assert index.modules[str(vllm_llama)].module == "vllm.model_executor.models.llama"   # parsed for that lookup


# ---------------------------------------------------------------------------------------------------------------
# HF Transformers

def test_hf_llama() -> None:
    path = locate_source_of("transformers.models.llama.modeling_llama")
    assert path == _package_dir("transformers") / "models" / "llama" / "modeling_llama.py"
    index = StaticIndex.from_files([path])
    attn = index.get_class("LlamaAttention")
    assert _line(path, attn.line).startswith("class LlamaAttention")
    calls = attn.forward_calls
    fn = next(c for c in calls if c.name == "apply_rotary_pos_emb")
    assert (fn.receiver, fn.kind) == (None, "function")
    assert "apply_rotary_pos_emb" in index.modules[str(path)].functions
    iq, ik, iv, irope, io = _order(calls, "q_proj", "k_proj", "v_proj", "apply_rotary_pos_emb", "o_proj")
    assert iq < ik < iv < irope < io
    assert all(c.kind == "submodule" for c in calls if c.name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert {n: s.constructor for n, s in attn.submodules.items()} == {
        "q_proj": "nn.Linear", "k_proj": "nn.Linear", "v_proj": "nn.Linear", "o_proj": "nn.Linear"}
    assert attn.submodules["q_proj"].qualname == "torch.nn.Linear"
    mod = index.modules[str(path)]
    assert mod.imports["ALL_ATTENTION_FUNCTIONS"] == "transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS"
    layers = index.get_class("LlamaModel").submodules["layers"]
    assert (layers.constructor, layers.element) == ("nn.ModuleList", "LlamaDecoderLayer")
    assert "self.o_proj(" in _line(path, index.find_forward_call_line("LlamaAttention", "o_proj"))


# ---------------------------------------------------------------------------------------------------------------
# SGLang: sources from the wheel, never installed

@pytest.fixture(scope="module")
def sglang_root() -> Path:
    done = subprocess.run(["bash", str(FETCH), SGLANG_VERSION], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"scripts/fetch_sglang_sources.sh failed (exit {done.returncode}):\n{done.stderr}")
    root = Path(done.stdout.strip().splitlines()[-1])
    assert (root / "sglang" / "srt" / "models" / "llama.py").is_file()
    return root


def test_sglang_fetch_is_cached(sglang_root: Path) -> None:
    # a second run must not reach pip at all: point it at a python that does not exist
    env = dict(os.environ, PYTHON="/nonexistent/python")
    done = subprocess.run(["bash", str(FETCH), SGLANG_VERSION], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "cached" in done.stderr and Path(done.stdout.strip()) == sglang_root
    assert (sglang_root / "WHEEL").read_text().startswith(f"sglang-{SGLANG_VERSION}-")


def test_sglang_models_parse_without_sglang(sglang_root: Path) -> None:
    assert importlib.util.find_spec("sglang") is None, "sglang must not be installed in the venv"
    assert locate_source_of("sglang.srt.models.llama") is None
    llama = locate_source_of("sglang.srt.models.llama", [sglang_root])
    qwen2 = locate_source_of("sglang.srt.models.qwen2", [sglang_root])
    assert llama == sglang_root / "sglang" / "srt" / "models" / "llama.py" and qwen2 is not None
    index = StaticIndex.from_files([llama, qwen2], roots=[sglang_root])
    assert "sglang" not in sys.modules

    for name in ("LlamaAttention", "LlamaForCausalLM", "LlamaModel", "Qwen2Attention", "Qwen2MLP",
                 "Qwen2ForCausalLM"):
        c = index.get_class(name)
        assert c is not None, name
        assert _line(c.file, c.line).startswith(f"class {name}")
    assert index.get_class("sglang.srt.models.qwen2.Qwen2Attention").module == "sglang.srt.models.qwen2"

    for name in ("LlamaAttention", "Qwen2Attention"):
        c = index.get_class(name)
        subs = c.submodules
        assert {"qkv_proj", "o_proj", "rotary_emb", "attn"} <= set(subs), name
        assert subs["qkv_proj"].constructor == "QKVParallelLinear"
        assert subs["attn"].constructor == "RadixAttention"
        assert subs["qkv_proj"].qualname == "sglang.srt.layers.linear.QKVParallelLinear"
        calls = [x for x in c.forward_calls if x.receiver == "self"]
        i_qkv, i_rope, i_attn, i_o = _order(calls, "qkv_proj", "rotary_emb", "attn", "o_proj")
        assert i_qkv < i_rope < i_attn < i_o, name
        line = index.find_forward_call_line(name, "qkv_proj")
        assert "self.qkv_proj(" in _line(c.file, line), name

    # SGLang's LlamaAttention.forward reaches qkv_proj through a helper method
    call = index.find_forward_call("LlamaAttention", "qkv_proj")
    assert call.via == "forward_prepare_native"

    mlp = index.get_class("Qwen2MLP")
    assert {"gate_up_proj", "down_proj", "act_fn"} <= set(mlp.submodules)
    assert index.get_class("Qwen2Model").submodules["layers"].element == "Qwen2DecoderLayer"
    stacked = index.get_class("LlamaForCausalLM").literal("stacked_params_mapping")
    assert (".qkv_proj", ".q_proj", "q") in stacked and (".gate_up_proj", ".up_proj", 1) in stacked
    assert index.get_class("Qwen2Attention").submodules["qkv_proj"].constructor == "QKVParallelLinear"


# ---------------------------------------------------------------------------------------------------------------
# Joining with the dynamic tree

def test_static_index_from_tree(vllm_llama: Path, tmp_path: Path) -> None:
    """The index the mapping agent reads class sources from (ekka_core.agent.source): lazy, over the tree's files."""
    node = SimpleNamespace(class_file=str(vllm_llama), qualname="vllm.model_executor.models.llama.LlamaAttention")
    gone = SimpleNamespace(class_file=str(tmp_path / "gone.py"), qualname="x.Gone")
    tree = SimpleNamespace(modules={"model.layers.0.self_attn": node, "other": gone})
    index = StaticIndex.from_tree(tree)
    assert index.modules == {}                                  # lazy: nothing parsed yet
    assert index.get_class(node.qualname).submodules["qkv_proj"].constructor == "QKVParallelLinear"
    assert module_name_for(vllm_llama) == "vllm.model_executor.models.llama"
