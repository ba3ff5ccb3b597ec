"""A trace's index, readable without torch: run metadata, the token layout of every forward step, every module call.

The trace format (written by :mod:`ekka_core.capture.trace`) is a directory of safetensors shards plus one JSON
index; never pickle::

    trace/
      index.json               run metadata, token layout of every forward step, every module call in order
      shard-00000.safetensors  tensors, named  c<call>.in<i> / c<call>.out<i>

A float32 tensor may be stored as its bf16-rounded difference from the tensor of the same key in a sibling trace
(``TensorRef.delta_over``: the fp32 reference over the low-precision reference it is compared with); read back, it
is that tensor in float32 plus the difference — within 2^-9 of the difference, a 2^-9 error in the noise the error
ratio measures, at half the bytes. A two-byte float tensor (bf16, f16) is stored as two planes
(``TensorRef.codec``): its low bytes, and its high bytes — sign and exponent, which take few values — compressed.

A *step* is one forward pass of the whole model. Its layout says which (sequence, position) every row of a
flattened activation belongs to, so the aligner can put prefill and decode rows of a batch back in order.
A *call* is one module invocation; calls are numbered in completion order (children before parents), which is
the order in which computation becomes final, so "the first call that diverges" is meaningful.

:class:`TraceIndex` is what light processes read (the language server's worker protocol, the remote client);
:class:`ekka_core.capture.trace.Trace` adds lazy tensor reads on top of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ekka_core.contracts.errors import BadInput

SCHEMA = "ekka.trace/3"
# Schemas this version reads: /1 had no ``delta_over`` (every tensor stored whole), /2 no ``codec`` (every tensor in
# one piece).
READABLE_SCHEMAS = ("ekka.trace/1", "ekka.trace/2", SCHEMA)
INDEX = "index.json"


# Floating-point dtypes as a trace spells them: activations (ids, masks and routing choices are not).
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass
class TensorRef:
    key: str
    shard: int
    shape: list[int]
    dtype: str                 # the tensor's dtype as computed (a delta-stored float32 tensor says float32)
    # Stored as ``bf16(this − base)``, base the tensor of the same key in the sibling trace directory of this name
    # (None: stored whole). Read through :meth:`ekka_core.capture.trace.Trace.tensor`, which adds the base back.
    delta_over: str | None = None
    # How the stored tensor is encoded (None: as it is). ``zstd-high-bytes/<bfloat16|float16>``: a two-byte float
    # tensor as two planes, its low bytes under ``key`` and its high bytes zstd-compressed under ``key/high.zst``
    # (lossless; :mod:`ekka_core.capture.trace`).
    codec: str | None = None
    # Not stored itself: a view of the stored tensor ``key`` (an input that was a view of an earlier output, unchanged
    # since): ``[storage offset, strides]`` in elements of that tensor, flat. Read as ``stored.as_strided(shape, …)``.
    view: list | None = None

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES


@dataclass
class ModuleCall:
    index: int
    step: int
    module: str            # dotted path from the model root ("" is the root)
    cls: str               # class name
    qualname: str          # module.qualname of the class
    class_file: str | None
    class_line: int | None
    forward_file: str | None
    forward_line: int | None
    shared_as: str | None = None  # the registered name, when one module object serves several call sites
    mutated_after_hook: bool = False   # an output was changed in place after the hook (value kept: hook time)
    rows: str = "tokens"   # "tokens": one row per token of the step; "sampled": one row per sequence (last token)
    # When the module was entered, on the completion clock: the index of the last call completed before it started
    # (-1: none in the trace yet; None: not recorded). Its inputs were observed then, after that call's output.
    entered_after: int | None = None
    inputs: list[TensorRef | str | None] = field(default_factory=list)   # str: summary of a non-tensor
    outputs: list[TensorRef | str | None] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)  # for dict-like outputs (HF ModelOutput)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "ModuleCall":
        def ref(x: Any) -> TensorRef | str | None:
            return TensorRef(**x) if isinstance(x, dict) else x
        d = dict(d)
        d["inputs"] = [ref(x) for x in d["inputs"]]
        d["outputs"] = [ref(x) for x in d["outputs"]]
        return ModuleCall(**d)


@dataclass
class Step:
    index: int
    phase: str                 # "prefill" or "decode:k"
    seq: list[int]             # per row: which sequence (prompt index)
    pos: list[int]             # per row: token position in that sequence
    req: list[str | None] | None = None   # the engine's raw request ids, kept when not resolved to sequences


@dataclass
class RunInfo:
    framework: str             # "hf" | "vllm" | "sglang"
    framework_version: str
    role: str                  # "target" | "reference" | "reference-fp32"
    model: str
    dtype: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    attn_implementation: str | None = None
    prompts: list[str] = field(default_factory=list)
    own_prompt_token_ids: list[list[int]] = field(default_factory=list)  # the framework's own tokenisation
    token_ids: list[list[int]] = field(default_factory=list)   # what was actually fed, per sequence
    prompt_lens: list[int] = field(default_factory=list)
    generated_ids: list[list[int]] = field(default_factory=list)
    # What the engine declares about how it loads HF weights (vLLM: packed_modules_mapping, hf_to_vllm_mapper)
    # and constants it folds into a parent's forward (Gemma's embedding normaliser): the mapper's ground truth.
    declared: dict[str, Any] = field(default_factory=dict)
    tp_rank: int = 0
    tp_size: int = 1
    # The size-control options this trace was captured with (module regex, storage dtype, token positions): a
    # restricted trace says so, and the aligner compares only the rows both sides kept.
    trace_options: dict[str, str] = field(default_factory=dict)
    # The engine configuration this run resolved (compile mode, custom ops, prefix caching, chunk budget, batch
    # size: what actually ran) and each argument it set differently from the served configuration, with why.
    resolved_config: dict[str, Any] = field(default_factory=dict)
    config_changes: list[dict[str, Any]] = field(default_factory=list)
    # Every module of the model (hooked calls or not): [class, qualname, class file, line, forward file, line].
    module_classes: dict[str, list[Any]] = field(default_factory=dict)
    # Every module of the model: the modules that own the parameters it computes with, each parameter counted once
    # under the name it was first registered by (a parameter a module borrows — vLLM's shared-expert gate, a tied
    # lm_head — is named after its owner). The mapping's ground truth for "both sides compute with the same
    # weights"; None for a trace written before it was recorded.
    module_weights: dict[str, list[str]] | None = None
    # Per owner: (Σw, Σw²[, Σ(i+j)·w, span]) of its own parameters, bf16-rounded (ekka_core.capture.hooks.weight_sums).
    weight_sums: dict[str, list[float]] = field(default_factory=dict)
    # Per sequence: prompt tokens a prefix-cache hit served (those positions were not computed for it).
    cached_tokens: list[int] = field(default_factory=list)
    complete: bool = False
    failure: str | None = None


def token_axis(shape: list[int] | tuple[int, ...], n: int) -> int | None:
    """The axis of an activation that holds a step's ``n`` tokens, or None when it has none.

    Engines pass flat ``[n, …]`` batches (axis 0). A reference batch of one is ``[1, L, …]`` or, per head,
    ``[1, heads, L, d]``: the second-to-last axis when it is ``n``, else the first axis of size ``n``."""
    if shape and shape[0] == n and (len(shape) == 1 or n == 1 or shape[0] != 1):
        return 0
    if shape and shape[0] == 1:
        if len(shape) >= 3 and shape[-2] == n:
            return len(shape) - 2
        for axis in range(1, len(shape)):
            if shape[axis] == n:
                return axis
    return None


class TraceIndex:
    """A trace directory's ``index.json``: run, steps and calls (no tensors)."""

    def __init__(self, directory: Path | str):
        self.dir = Path(directory)
        index_path = self.dir / INDEX
        if not index_path.exists():
            raise BadInput(f"{self.dir} is not an Ekka trace (no {INDEX})",
                           fix="point at a directory written by `ekka diagnose` or by Ekka's plugin (EKKA_TRACE_DIR)")
        try:
            index = json.loads(index_path.read_text())
        except ValueError as e:
            raise BadInput(f"{index_path} is not valid JSON ({e})",
                           fix="capture the trace again (--fresh); a trace index is written atomically, so this one "
                               "was edited or truncated by hand") from None
        if index.get("schema") not in READABLE_SCHEMAS:
            raise BadInput(f"{index_path} has schema {index.get('schema')!r}, expected {SCHEMA!r}",
                           fix="re-capture with this version of Ekka (`--fresh`)")
        self.run = RunInfo(**index["run"])
        self.steps = [Step(**s) for s in index["steps"]]
        self.calls = [ModuleCall.from_json(c) for c in index["calls"]]
        self._by_module: dict[str, list[ModuleCall]] | None = None

    def by_module(self) -> dict[str, list[ModuleCall]]:
        """Every module's calls in completion order (built once: every stage looks calls up by module)."""
        if self._by_module is None:
            self._by_module = {}
            for c in self.calls:
                self._by_module.setdefault(c.module, []).append(c)
        return self._by_module

    def calls_of(self, module: str) -> list[ModuleCall]:
        return self.by_module().get(module, [])

    def modules(self) -> dict[str, ModuleCall]:
        """First call of every module that ran, in completion order."""
        first: dict[str, ModuleCall] = {}
        for c in self.calls:
            first.setdefault(c.module, c)
        return first
