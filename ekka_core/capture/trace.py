"""Writing and reading traces with their tensors (the format and the index: :mod:`ekka_core.contracts.trace_index`).

Tensors are cloned at hook time: fused kernels (vLLM's add+RMSNorm) later overwrite their inputs in place.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ekka_core.contracts.trace_index import (INDEX, SCHEMA, ModuleCall, RunInfo, Step, TensorRef, TraceIndex,
                                             token_axis)

__all__ = ["INDEX", "SCHEMA", "ModuleCall", "RunInfo", "Step", "TensorRef", "Trace", "TraceIndex", "TraceWriter",
           "token_axis"]


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
        # One copy, whatever the layout (``to(copy=True).contiguous()`` copied a strided tensor twice).
        t = t.clone(memory_format=torch.contiguous_format) if t.device.type == "cpu" else t.to("cpu").contiguous()
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


class Trace(TraceIndex):
    """A trace on disk. Tensors are read lazily, one at a time, from memory-mapped shards."""

    def __init__(self, directory: Path | str):
        super().__init__(directory)
        self._handles: dict[int, Any] = {}
        self._bytes_read = 0
        # How this engine's decoder layers carry the residual stream (settled by the alignment proof from the trace
        # itself): True — (delta, residual), summed back (vLLM's Llama); False — the first output already is the
        # whole stream (vLLM's StableLM, Cohere return (stream, stream before the block)).
        self.stream_summed = True
        # (embedding module, constant) the engine multiplies its embedding by outside the module, measured by the
        # alignment proof where the engine declares none (None: none found).
        self.embedding_scale: tuple[str, float] | None = None

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
