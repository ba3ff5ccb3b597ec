"""Writing and reading traces with their tensors (the format and the index: :mod:`ekka_core.contracts.trace_index`).

Tensors are copied at hook time: fused kernels (vLLM's add+RMSNorm) later overwrite their inputs in place.

The fp32 reference is written over the low-precision reference (``TraceWriter(delta_base=…)``): each float32
tensor is stored as its bf16-rounded difference from the base's tensor of the same key and module. What the error
ratio measures *is* that difference (‖X_R − Y_R‖, the reference's own rounding noise), so rounding it to bf16 errs
by 2^-9 of the noise — at half the bytes of the largest trace of a diagnosis (1054 → 525 MB for a 1B-shaped model's
306-token prompt).

Two-byte floats (bf16, f16) are stored as two planes (``TensorRef.codec``): the low bytes as they are, the high bytes
— the sign and seven of the eight exponent bits — compressed with zstd. An activation's exponents take few values,
so that plane shrinks to about 3 bits per element, while the mantissas are as random as rounding makes them and stay
raw: lossless, every value read back bit for bit, at about 0.69 of the bytes (``benchmarks/trace_codec.py``).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

try:
    import zstandard
except ImportError:      # an engine's own environment (an older release, a remote host) that lacks it: see split_codec
    zstandard = None

from ekka_core.contracts.errors import BadInput, InternalFailure
from ekka_core.contracts.trace_index import (INDEX, SCHEMA, ModuleCall, RunInfo, Step, TensorRef, TraceIndex,
                                             token_axis)

__all__ = ["INDEX", "SCHEMA", "ModuleCall", "RunInfo", "Step", "TensorRef", "Trace", "TraceIndex", "TraceWriter",
           "token_axis"]


class TraceWriter:
    """Streams tensors to safetensors shards as they are captured.

    Each tensor is copied once, at hook time, straight into a shard buffer: a byte arena laid out as the shard's
    data section will be on disk (the tensors packed one after the other, a ``__pad…`` entry of a few bytes where the
    next tensor's element size needs it, as the format allows no holes). A full buffer is written — its header, then
    its bytes as they are — by a background thread while capture fills the other one; the two buffers are reused for
    every shard. So a traced tensor costs one copy and no allocation: cloning each one and serialising it with
    ``safetensors.torch.save_file`` cost three copies and the page faults of a fresh allocation per tensor. A tensor
    larger than a buffer is a shard of its own."""

    def __init__(self, directory: Path, run: RunInfo, *, shard_bytes: int = 64 << 20,
                 store_dtype: torch.dtype | None = None, delta_base: Path | None = None):
        self.dir = Path(directory)
        # A complete sibling trace of the same calls (the low-precision reference) float32 tensors are stored over.
        self._base = _DeltaBase(Trace(delta_base)) if delta_base is not None else None
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("shard-*.safetensors"):
            old.unlink()
        (self.dir / INDEX).unlink(missing_ok=True)
        self.run = run
        self.shard_bytes = shard_bytes
        self.store_dtype = store_dtype
        self.steps: list[Step] = []
        self.calls: list[ModuleCall] = []
        self._filling = _ShardBuffer(shard_bytes)
        self._spare: _ShardBuffer | None = None       # the other buffer, once it exists (possibly being written)
        self._shard = 0
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ekka-trace-writer")
        self._inflight: Future | None = None

    def add_tensor(self, key: str, t: torch.Tensor, module: str | None = None) -> TensorRef:
        """Store ``t`` under ``key``; ``module``: the module whose call stores it (a tensor is stored over the delta
        base only where the base stored that key for the same module)."""
        t = t.detach()
        dtype = self.store_dtype if self.store_dtype is not None and t.is_floating_point() else t.dtype
        computed = str(dtype).removeprefix("torch.")
        delta = self._base.delta(key, t.to(dtype), module) if self._base is not None else None
        if delta is not None:
            t, dtype = delta, delta.dtype
        nbytes = t.numel() * dtype.itemsize
        with self._lock:
            if not self._filling.has_room(nbytes, dtype):
                self._flush()
            if not self._filling.has_room(nbytes, dtype):          # larger than a whole buffer: a shard of its own
                self._filling = _ShardBuffer(nbytes)
            shard = self._shard
            self._filling.put(key, t, dtype)
        return TensorRef(key=key, shard=shard, shape=list(t.shape), dtype=computed,
                         delta_over=None if delta is None else self._base.name, codec=split_codec(dtype, nbytes))

    def _flush(self) -> None:
        """Hand the filled buffer to the writer thread and fill the other one (waiting for its own write first)."""
        if self._filling.empty:
            return
        full = self._filling
        self._drain()
        self._inflight = self._io.submit(full.write, self.dir / f"shard-{self._shard:05d}.safetensors")
        self._shard += 1
        spare = self._spare
        if spare is None or spare.capacity < self.shard_bytes:
            spare = _ShardBuffer(self.shard_bytes)
        spare.clear()
        # the written one is the spare next time (a one-off larger buffer is dropped once written)
        self._spare = full if full.capacity == self.shard_bytes else None
        self._filling = spare

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


# safetensors' names of the dtypes a trace stores (and a checkpoint's weights are read as: residency).
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3",
                      torch.float8_e5m2: "F8_E5M2"}


# …and the other way round: a safetensors header's dtype name → the torch dtype
DTYPE_OF_NAME = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}

# The codec of a two-byte float tensor stored as two planes (see the module's docstring): "<name>/<stored dtype>".
SPLIT_CODEC = "zstd-high-bytes"
# Smaller tensors stay whole: a compressed frame's own bytes and a second entry would outweigh what they save.
SPLIT_MIN_BYTES = 4096
# The plane of high bytes is stored under the tensor's key plus this; the low bytes under the key itself.
HIGH_BYTES = "/high.zst"


def _compressor() -> Any:
    """zstd tuned for a plane of exponents. What it holds is a skewed distribution of byte values, not repeated
    strings: the entropy coder does the work, so the match finder is the cheapest zstd has (fast strategy, a 64-entry
    hash, 7-byte matches). On a 1B-shaped Llama's traces that plane came out 5 % smaller than at zstd's level 1, at
    about twice its speed (~600–900 MB/s against ~350 MB/s, one core; levels 2–9 were slower and no smaller)."""
    return zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(
        window_log=17, hash_log=6, chain_log=6, search_log=1, min_match=7, target_length=0,
        strategy=zstandard.STRATEGY_FAST))


def split_codec(dtype: torch.dtype, nbytes: int) -> str | None:
    """The codec a tensor of ``dtype`` and ``nbytes`` is stored with (None: whole). A target captured in an
    environment that has the engine but not zstandard (``--python``, a remote host: Ekka's code travels there
    without its dependencies) stores its tensors whole: larger, and read the same."""
    if zstandard is not None and dtype in (torch.bfloat16, torch.float16) and nbytes >= SPLIT_MIN_BYTES:
        return f"{SPLIT_CODEC}/{str(dtype).removeprefix('torch.')}"
    return None


def _split_planes(raw: torch.Tensor, compressor: Any) -> tuple[np.ndarray, bytes]:
    """A two-byte float tensor's bytes (little-endian, as torch lays them out on every platform it runs on): its
    low bytes, and its high bytes zstd-compressed."""
    pairs = raw.numpy().reshape(-1, 2)          # numpy gathers a strided byte plane in half torch's time
    return pairs[:, 0].copy(), compressor.compress(pairs[:, 1].copy())


def _join_planes(low: torch.Tensor, high_compressed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`_split_planes`: the tensor's elements, flat, in ``dtype``."""
    high = np.frombuffer(zstandard.ZstdDecompressor().decompress(high_compressed.numpy()), dtype=np.uint8)
    pairs = torch.empty((low.numel(), 2), dtype=torch.uint8)
    view = pairs.numpy()
    view[:, 0] = low.numpy()
    view[:, 1] = high
    return pairs.view(dtype).view(-1)


class _ShardBuffer:
    """One shard's data section being filled: a byte arena and the header entries of the tensors packed into it."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.data = torch.empty(capacity, dtype=torch.uint8)
        self.used = 0
        self.header: dict[str, dict[str, Any]] = {}

    @property
    def empty(self) -> bool:
        return not self.header

    def clear(self) -> None:
        self.used, self.header = 0, {}

    def has_room(self, nbytes: int, dtype: torch.dtype) -> bool:
        return self.used + (-self.used) % dtype.itemsize + nbytes <= self.capacity

    def put(self, key: str, t: torch.Tensor, dtype: torch.dtype) -> None:
        """Copy ``t`` (any layout, device, dtype: converted to ``dtype`` as it is copied) to the end of the arena."""
        if dtype not in SAFETENSORS_DTYPES:
            raise InternalFailure(f"a traced tensor {key} has dtype {dtype}, which a safetensors trace cannot store")
        size = dtype.itemsize
        pad = (-self.used) % size
        if pad:          # the next element size's alignment, filled: the format allows no holes
            self.header[f"__pad{self.used}"] = {"dtype": "U8", "shape": [pad],
                                                "data_offsets": [self.used, self.used + pad]}
            self.used += pad
        nbytes = t.numel() * size
        if nbytes:
            self.data[self.used:self.used + nbytes].view(dtype).view(t.shape).copy_(t)
        self.header[key] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(t.shape),
                            "data_offsets": [self.used, self.used + nbytes]}
        self.used += nbytes

    def write(self, path: Path) -> None:
        """The safetensors file: the header's length (8 bytes, little-endian), the header (JSON, padded with spaces to
        a multiple of 8), then the data section — the arena as it lies, or, where tensors are split
        (:func:`split_codec`, the rule the refs were given by), the arena's tensors in order with each split one as
        its two planes (compressed here, in the writer's thread: zstd lets go of the GIL while it works)."""
        if any(self._split(entry) for entry in self.header.values()):
            header, sections = self._split_sections()
        else:
            header, sections = self.header, [self.data[:self.used].numpy()]
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * ((-len(text)) % 8)
        with open(path, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for data in sections:
                f.write(memoryview(data))

    @staticmethod
    def _split(entry: dict[str, Any]) -> bool:
        start, end = entry["data_offsets"]
        return split_codec(DTYPE_OF_NAME[entry["dtype"]], end - start) is not None

    def _split_sections(self) -> tuple[dict[str, dict[str, Any]], list[np.ndarray | bytes]]:
        """The header and the data section's pieces in order: each split tensor as its two ``U8`` planes, the others
        as they lie in the arena, an element size's alignment padded as :meth:`put` pads it."""
        compressor = _compressor()
        header: dict[str, dict[str, Any]] = {}
        sections: list[np.ndarray | bytes] = []
        at = 0

        def add(key: str, dtype: str, shape: list[int], data: np.ndarray | bytes) -> None:
            nonlocal at
            size = data.nbytes if isinstance(data, np.ndarray) else len(data)
            header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + size]}
            sections.append(data)
            at += size

        for key, entry in self.header.items():
            if key.startswith("__pad"):
                continue
            start, end = entry["data_offsets"]
            raw = self.data[start:end]
            if self._split(entry):
                low, high = _split_planes(raw, compressor)
                add(key, "U8", [low.nbytes], low)
                add(key + HIGH_BYTES, "U8", [len(high)], high)
                continue
            pad = (-at) % DTYPE_OF_NAME[entry["dtype"]].itemsize
            if pad:
                add(f"__pad{at}", "U8", [pad], bytes(pad))
            add(key, entry["dtype"], entry["shape"], raw.numpy())
        return header, sections


class _DeltaBase:
    """The trace float32 tensors are written over: its tensors by key, the module that stored each, and the rule for
    when a difference is stored (:meth:`delta`).

    The rounded difference errs by 2^-9 of the difference itself, and the difference from the base — the same
    module's call in the low-precision run — is X_R − Y_R, the reference's own rounding noise every comparison
    divides by. So the error is 2^-9 of that noise however large the noise is (a random-weight 1B-shaped model's deep layers
    differ between bf16 and fp32 by up to 65 % of a row, measured), and the difference is stored whenever the base
    holds the same module's tensor of that shape."""

    def __init__(self, base: "Trace"):
        self.trace, self.name = base, base.dir.name
        self.refs = base.refs_by_key()
        self.owner: dict[str, str] = {}         # key → the module whose call stored it (the first to name it)
        for call in base.calls:
            for r in (*call.inputs, *call.outputs):
                if isinstance(r, TensorRef) and r.view is None:
                    self.owner.setdefault(r.key, call.module)

    def delta(self, key: str, t: torch.Tensor, module: str | None) -> torch.Tensor | None:
        """``bf16(t − base)`` for a float32 ``t`` whose base tensor the same module stored with its shape, the
        difference finite; else None (stored whole)."""
        ref = self.refs.get(key)
        if t.dtype != torch.float32 or ref is None or ref.delta_over is not None or ref.shape != list(t.shape) \
                or not ref.is_float or module is None or self.owner.get(key) != module:
            return None
        delta = (t - self.trace.tensor(ref).float()).to(torch.bfloat16)
        self.trace.release(above_bytes=256 << 20)
        if not bool(torch.isfinite(delta).all()):     # an overflow on either side is stored as it happened
            return None
        return delta


def _stored_dtype(ref: TensorRef) -> torch.dtype:
    name, _, dtype = (ref.codec or "").partition("/")
    if name != SPLIT_CODEC or dtype not in ("bfloat16", "float16"):
        raise BadInput(f"tensor {ref.key} is stored with codec {ref.codec!r}, which this version of Ekka cannot read",
                       fix="read the trace with the Ekka that wrote it, or capture it again (--fresh)")
    if zstandard is None:
        raise BadInput(f"tensor {ref.key} is stored with its high bytes zstd-compressed, and this environment lacks "
                       "zstandard", fix="pip install zstandard (bash scripts/setup.sh installs it)")
    return getattr(torch, dtype)


class Trace(TraceIndex):
    """A trace on disk. Tensors are read lazily, one at a time, from memory-mapped shards."""

    def __init__(self, directory: Path | str):
        super().__init__(directory)
        self._handles: dict[int, Any] = {}
        self._bytes_read = 0
        self._refs: dict[str, TensorRef] | None = None
        self._bases: dict[str, Trace] = {}
        # How this engine's decoder layers carry the residual stream (settled by the alignment proof from the trace
        # itself): True — (delta, residual), summed back (vLLM's Llama); False — the first output already is the
        # whole stream (vLLM's StableLM, Cohere return (stream, stream before the block)).
        self.stream_summed = True
        # (embedding module, constant) the engine multiplies its embedding by outside the module, measured by the
        # alignment proof where the engine declares none (None: none found).
        self.embedding_scale: tuple[str, float] | None = None

    def tensor(self, ref: TensorRef) -> torch.Tensor:
        if ref.view is not None:
            stored = self.refs_by_key().get(ref.key)
            if stored is None:
                raise BadInput(f"{self.dir}: an input is stored as a view of tensor {ref.key}, which the trace lacks",
                               fix="capture the trace again (--fresh)")
            offset, strides = ref.view
            flat = self.tensor(stored).reshape(-1)
            return flat.as_strided(ref.shape, strides, flat.storage_offset() + offset).contiguous()
        h = self._handles.get(ref.shard)
        if h is None:
            h = safe_open(str(self.dir / f"shard-{ref.shard:05d}.safetensors"), framework="pt")
            self._handles[ref.shard] = h
        t = h.get_tensor(ref.key)
        if ref.codec is not None:
            t = _join_planes(t, h.get_tensor(ref.key + HIGH_BYTES), _stored_dtype(ref)).view(ref.shape)
        self._bytes_read += t.numel() * t.element_size()
        if ref.delta_over is not None:
            base = self._delta_base(ref.delta_over)
            base_ref = base.refs_by_key().get(ref.key)
            if base_ref is None:
                raise BadInput(f"{self.dir}: tensor {ref.key} is stored over {base.dir}, which lacks it",
                               fix="keep a diagnosis's traces together, or capture them again (--fresh)")
            t = base.tensor(base_ref).float() + t.float()
        return t

    def refs_by_key(self) -> dict[str, TensorRef]:
        """Every stored tensor of this trace by key (built once)."""
        if self._refs is None:
            self._refs = {r.key: r for c in self.calls for r in (*c.inputs, *c.outputs)
                          if isinstance(r, TensorRef) and r.view is None}
        return self._refs

    def _delta_base(self, name: str) -> "Trace":
        """The sibling trace a delta-stored tensor is stored over (opened once)."""
        base = self._bases.get(name)
        if base is None:
            path = self.dir.parent / name
            if not (path / INDEX).exists():
                raise BadInput(f"{self.dir} stores its float32 tensors over the trace {path}, which is missing",
                               fix="keep a diagnosis's traces together (copy the whole traces/ directory), or "
                                   "capture them again (--fresh)")
            base = self._bases[name] = Trace(path)
        return base

    def release(self, *, above_bytes: int = 0) -> None:
        """Drop the open shard mappings once more than ``above_bytes`` were read through them: pages read so far
        stop counting against this process, so reading a trace pair by pair keeps memory flat however large the
        trace, without re-opening shards for every pair (the next read re-opens what it needs)."""
        if self._bytes_read > above_bytes:
            self._handles.clear()
            self._bytes_read = 0
        for base in self._bases.values():
            base.release(above_bytes=above_bytes)
