"""The toy model the mapping agent's tests map (tests/agent/): trees built by hand, synthetic traces written with
TraceWriter, the fake API's scripts. A target MLP holds ``fancy_proj`` (class ``WeirdLinear``) where the reference
holds ``dense_h_to_4h`` — a path no rule can connect."""

from __future__ import annotations

from pathlib import Path

from ekka_core.agent import AgentConfig
from ekka_core.capture.trace import ModuleCall, RunInfo, Step, Trace, TraceWriter
from ekka_core.mapping import ComponentPair, Endpoint, Mapping
from ekka_core.tree import ModelTree, ModuleNode
from fake_anthropic import FakeAnthropic, text, tool_use
from owners import derive_weights

FANCY = "model.layers.0.mlp.fancy_proj"
DENSE = "model.layers.0.mlp.dense_h_to_4h"

TOY_SOURCE = '''\
import torch
from torch import nn


class WeirdLinear(nn.Module):
    """hidden -> 4*hidden, loads the checkpoint's dense_h_to_4h weight."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4 * hidden, hidden))

    def forward(self, x):
        return x @ self.weight.t()


class FusedUp(nn.Module):
    def forward(self, x):
        return x
'''


FUSED = "model.layers.0.mlp.fused"
FUSED_REFS = ["model.layers.0.mlp.b_proj", "model.layers.0.mlp.a_proj"]
CONCAT_ALIGNER = ("import numpy as np\nSELF_CHECKS = ['shape', 'row_sums', 'col_sums']\n\n"
                  "def align(target, reference, meta):\n"
                  "    ref = np.concatenate([reference['m0.out0'][0], reference['m1.out0'][0]], axis=-1)\n"
                  "    return target['out0'], ref\n")


def tree_of(framework: str, spec: list[tuple[str, str, int | None]], src: Path) -> ModelTree:
    tree = ModelTree(framework)
    for i, (name, cls, out) in enumerate(spec):
        line = {"WeirdLinear": 5, "FusedUp": 16}.get(cls, 1)
        tree.modules[name] = ModuleNode(name, cls, f"toy_model.{cls}", str(src), line, str(src), line + 5, calls=1,
                                        first_call=i, out_features=out)
    return derive_weights(tree)


def toy_trees(src: Path, layers: int = 1, fused: bool = False) -> tuple[ModelTree, ModelTree]:
    t: list[tuple[str, str, int | None]] = [("model.embed_tokens", "VocabParallelEmbedding", 256)]
    r: list[tuple[str, str, int | None]] = [("model.embed_tokens", "Embedding", 256)]
    for i in range(layers):
        L = f"model.layers.{i}"
        t += [(f"{L}.mlp.fancy_proj", "WeirdLinear", 1024)]
        r += [(f"{L}.mlp.dense_h_to_4h", "Linear", 1024)]
        if fused:
            t += [(f"{L}.mlp.fused_up", "FusedUp", 1536)]
            r += [(f"{L}.mlp.up_a", "Linear", 1024), (f"{L}.mlp.up_b", "Linear", 512)]
        t += [(f"{L}.mlp", "ToyMLP", 256), (L, "ToyDecoderLayer", 256)]
        r += [(f"{L}.mlp", "ToyMLP", 256), (L, "ToyDecoderLayer", 256)]
    t += [("model.norm", "RMSNorm", 256), ("logits_processor", "LogitsProcessor", 512),
          ("", "EkkaToyForCausalLM", None)]
    r += [("model.norm", "RMSNorm", 256), ("lm_head", "Linear", 512), ("", "EkkaToyForCausalLM", None)]
    return tree_of("vllm", t, src), tree_of("hf", r, src)


def config(api: FakeAnthropic | None, tmp_path: Path, **kw) -> tuple[AgentConfig, list[float]]:
    sleeps: list[float] = []
    base = dict(api_key="test-key", base_url=api.url if api else None, kb_dir=tmp_path / "kb", shipped_kb=False,
                sleep=sleeps.append, timeout_s=5.0, target_version="0.32.0", reference_version="5.19.0")
    base.update(kw)
    return AgentConfig(**base), sleeps


def script_happy(api: FakeAnthropic, usage=(1000, 50)) -> None:
    """get_model_tree ×2 → get_class_definition → propose_mapping → finish."""
    api.reply(text("Looking at both trees."), tool_use("get_model_tree", {"framework": "target"}),
              tool_use("get_model_tree", {"framework": "reference"}), usage=usage)
    api.reply(tool_use("get_class_definition", {"framework": "target", "class_name": "WeirdLinear"}), usage=usage)
    api.reply(tool_use("propose_mapping", {"target_module": FANCY, "reference_modules": [DENSE], "relation": "1:1",
                                           "reason": "WeirdLinear loads dense_h_to_4h's weight: same projection"}),
              usage=usage)
    api.reply(tool_use("finish", {"summary": "mapped fancy_proj"}), usage=usage)


def write_trace(directory: Path, framework: str, role: str, steps: list[Step], calls, src: Path,
           token_ids: list[list[int]] = ([1, 2, 3, 4, 5, 6],), prompt_lens: list[int] = (5,),
           trace_options: dict[str, str] | None = None) -> Trace:
    run = RunInfo(framework=framework, framework_version="0.32.0" if framework == "vllm" else "5.19.0", role=role,
                  model="toy", dtype="float32", prompts=["p"] * len(token_ids), token_ids=[list(t) for t in token_ids],
                  prompt_lens=list(prompt_lens), trace_options=dict(trace_options or {}))
    w = TraceWriter(directory, run)
    w.steps = steps
    for idx, (step, module, cls, outputs, inputs) in enumerate(calls):
        outs = [w.add_tensor(f"c{idx}.out{k}", t) for k, t in enumerate(outputs)]
        ins = [w.add_tensor(f"c{idx}.in{k}", t) for k, t in enumerate(inputs)]
        w.calls.append(ModuleCall(index=idx, step=step, module=module, cls=cls, qualname=f"toy_model.{cls}",
                                  class_file=str(src), class_line=5, forward_file=str(src), forward_line=12,
                                  inputs=ins, outputs=outs))
    w.close(complete=True)
    return Trace(directory)


def batch_mapping(aligner: str | None) -> Mapping:
    m = Mapping("vllm", "hf")
    m.pairs = [ComponentPair(FANCY, "1:1", "agent", Endpoint([FANCY]), Endpoint([DENSE])),
               ComponentPair(FUSED, "1:N", "agent", Endpoint([FUSED]), Endpoint(FUSED_REFS, split_sizes=[6, 4]),
                             aligner=aligner)]
    return m


def count_sandbox_children(monkeypatch) -> list[int]:
    from ekka_core.align import sandbox
    spawned: list[int] = []
    real = sandbox._spawn

    def counting(*args, **kwargs):
        spawned.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sandbox, "_spawn", counting)
    return spawned
