"""The trace format: a directory of safetensors shards plus one JSON index. Never pickle.

    trace/
      index.json            run metadata, token layout of every forward step, every module call in order
      shard-00000.safetensors  tensors, named  c<call>.in<i> / c<call>.out<i>

A *step* is one forward pass of the whole model. Its layout says which (sequence, position) every row of a
flattened activation belongs to, so the aligner can put prefill and decode rows of a batch back in order.
A *call* is one module invocation; calls are numbered in completion order (children before parents), which is
the order in which computation becomes final, so "the first call that diverges" is meaningful.

Tensors are cloned at hook time: fused kernels (vLLM's add+RMSNorm) later overwrite their inputs in place.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ekka_core.errors import BadInput

SCHEMA = "ekka.trace/1"
INDEX = "index.json"


@dataclass
class TensorRef:
    key: str
    shard: int
    shape: list[int]
    dtype: str


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


class TraceWriter:
    """Streams tensors to safetensors shards as they are captured. A full shard is written by a background thread
    while capture goes on; at most one shard is in flight, so host memory holds two shards at most."""

    def __init__(self, directory: Path, run: RunInfo, *, shard_bytes: int = 64 << 20,
                 store_dtype: torch.dtype | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("shard-*.safetensors"):
            old.unlink()
        (self.dir / INDEX).unlink(missing_ok=True)
        self.run = run
        self.shard_bytes = shard_bytes
        self.store_dtype = store_dtype
        self.steps: list[Step] = []
        self.calls: list[ModuleCall] = []
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shard = 0
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ekka-trace-writer")
        self._inflight: Future | None = None

    def add_tensor(self, key: str, t: torch.Tensor) -> TensorRef:
        t = t.detach()
        if self.store_dtype is not None and t.is_floating_point():
            t = t.to(self.store_dtype)
        t = t.to("cpu", copy=True).contiguous()
        with self._lock:
            self._pending[key] = t
            self._pending_bytes += t.numel() * t.element_size()
            ref = TensorRef(key=key, shard=self._shard, shape=list(t.shape), dtype=str(t.dtype).removeprefix("torch."))
            if self._pending_bytes >= self.shard_bytes:
                self._flush()
        return ref

    def _flush(self) -> None:
        if self._pending:
            self._drain()
            self._inflight = self._io.submit(save_file, self._pending,
                                             str(self.dir / f"shard-{self._shard:05d}.safetensors"))
            self._shard += 1
        self._pending = {}
        self._pending_bytes = 0

    def _drain(self) -> None:
        if self._inflight is not None:
            self._inflight.result()      # re-raises a failed write (disk full) here, in the capturing thread
            self._inflight = None

    def checkpoint(self) -> None:
        """Make what was captured so far readable on disk (marked incomplete): for engines Ekka does not drive."""
        self.close(complete=False, failure="still running or not closed")

    def close(self, *, complete: bool, failure: str | None = None) -> Path:
        """Write the index. An incomplete trace (crash, cut short) is kept and marked so, never discarded."""
        with self._lock:
            self._flush()
            self._drain()
            self.run.complete = complete
            self.run.failure = failure
            index = {"schema": SCHEMA, "run": asdict(self.run), "steps": [asdict(s) for s in self.steps],
                     "calls": [asdict(c) for c in self.calls]}
            tmp = self.dir / (INDEX + ".tmp")
            tmp.write_text(json.dumps(index))
            tmp.replace(self.dir / INDEX)
        return self.dir


class Trace:
    """A trace on disk. Tensors are read lazily, one at a time, from memory-mapped shards."""

    def __init__(self, directory: Path | str):
        self.dir = Path(directory)
        index_path = self.dir / INDEX
        if not index_path.exists():
            raise BadInput(f"{self.dir} is not an Ekka trace (no {INDEX})",
                           fix="point at a directory written by `ekka capture` / `ekka diagnose`")
        index = json.loads(index_path.read_text())
        if index.get("schema") != SCHEMA:
            raise BadInput(f"{index_path} has schema {index.get('schema')!r}, expected {SCHEMA!r}",
                           fix="re-capture with this version of Ekka (`--fresh`)")
        self.run = RunInfo(**index["run"])
        self.steps = [Step(**s) for s in index["steps"]]
        self.calls = [ModuleCall.from_json(c) for c in index["calls"]]
        self._handles: dict[int, Any] = {}
        self._bytes_read = 0
        self._by_module: dict[str, list[ModuleCall]] | None = None

    def tensor(self, ref: TensorRef) -> torch.Tensor:
        h = self._handles.get(ref.shard)
        if h is None:
            h = safe_open(str(self.dir / f"shard-{ref.shard:05d}.safetensors"), framework="pt")
            self._handles[ref.shard] = h
        t = h.get_tensor(ref.key)
        self._bytes_read += t.numel() * t.element_size()
        return t

    def release(self, *, above_bytes: int = 0) -> None:
        """Drop the open shard mappings once more than ``above_bytes`` were read through them: pages read so far
        stop counting against this process, so reading a trace pair by pair keeps memory flat however large the
        trace, without re-opening shards for every pair (the next read re-opens what it needs)."""
        if self._bytes_read > above_bytes:
            self._handles.clear()
            self._bytes_read = 0

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

