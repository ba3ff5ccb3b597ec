"""How much of a checkpoint the capture's processes keep resident (issue 25: a diagnosis's peak memory at most 1.5× a
served run's).

The reference loads the checkpoint twice — in the engine's low precision and in fp32 — beside the traced engine,
which loads it too. What each holds is kept to what it computes with, never by changing a value:

* :func:`stored_float_dtype` — the dtype a checkpoint stores its floating tensors in (its safetensors headers).
* :func:`letting_go_while_loading` — a scope in which the pages of the mapped checkpoint are let go as the load goes
  on. Used when the run's dtype differs from the stored one, so that every tensor is converted (copied) anyway:
  otherwise every page of the file touched while converting stayed resident until the load ended — a 1B-shaped
  model's fp32 checkpoint loaded in bf16 peaked at 5.9 GB; letting go every 0.1 s, at 2.9 GB in the same time (read
  by ``pread`` instead: 2.4 GB in 4.6× the time, its fresh buffers' page faults). Ekka's vLLM plugin wraps the traced
  engine's loader in it too (``EKKA_LET_GO_WHILE_LOADING``): 6.1 → 3.7 GB. (``benchmarks/residency_cost.py``.)
* :func:`release_after_forward` — for a model loaded in the stored dtype, whose weights are zero-copy views of the
  mapped checkpoint: each module's own weights are let go (``madvise(MADV_DONTNEED)``) once its forward has used
  them. They stay in the page cache; a later use maps them again from there. Otherwise the fp32 reference of that
  model held all 4 GB mapped to the end of its forward (4.2 → 0.6 GB). Only pages that are still the file's are let go (the
  process's page map says so): a page something wrote into is private memory, and letting it go would lose it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from ekka_core.capture.trace import DTYPE_OF_NAME

# safetensors' dtype names → torch dtypes, the floating ones (what a checkpoint stores weights in)
_STORED = {name: dtype for name, dtype in DTYPE_OF_NAME.items() if dtype.is_floating_point}


def stored_float_dtype(model: str) -> torch.dtype | None:
    """The dtype most of a local checkpoint's floating bytes are stored in (None: no safetensors files to read)."""
    weight: Counter[torch.dtype] = Counter()
    for path in sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []:
        try:
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
        except (OSError, ValueError):
            continue
        for name, entry in header.items():
            dtype = _STORED.get(entry.get("dtype")) if name != "__metadata__" else None
            if dtype is not None:
                start, end = entry["data_offsets"]
                weight[dtype] += end - start
    return weight.most_common(1)[0][0] if weight else None


@contextlib.contextmanager
def letting_go_while_loading(model: str, every: float = 0.1) -> Iterator[None]:
    """Inside this scope, every ``every`` seconds, the pages of this process's mappings of ``model``'s checkpoint
    files that are still the files' are let go. A load that converts every tensor reads each once, so a page let go
    early is at worst mapped again from the page cache — the same bytes; what stays resident is what the load
    touched in the last interval, not the whole file. Nothing of the loader is patched."""
    # as /proc/self/maps names them: symlinks resolved (a hub cache's snapshot links to its blobs)
    files = {os.path.realpath(p) for p in Path(model).glob("*.safetensors")} if Path(model).is_dir() else set()
    if not files or not _PAGES.available:
        yield
        return
    stop = threading.Event()

    def let_go() -> None:
        while not stop.wait(every):
            _PAGES.release_mappings(files)

    watcher = threading.Thread(target=let_go, name="ekka-let-go-while-loading", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def release_after_forward(model: nn.Module) -> int:
    """After each forward of a module that owns parameters mapped from a file, let go of their pages that are still
    the file's. Returns how many modules were hooked (0 where no parameter is mapped from a file: memory the process
    owns is never let go)."""
    if not _PAGES.available:
        return 0
    files = _file_mappings()
    hooked = 0
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False)
               if p.device.type == "cpu" and p.numel() and _within(files, p)]
        if own:
            module.register_forward_hook(_Release(own))
            hooked += 1
    return hooked


class _Release:
    """A forward hook letting go of some parameters' file pages (returns None: the module's output stands)."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params

    def __call__(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        for p in self.params:
            _PAGES.release(p)


def _file_mappings(paths: set[str] | None = None) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of regular files (``/proc/self/maps`` lines with a path), or of
    the files in ``paths`` only."""
    ranges = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and (paths is None or fields[5] in paths):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    except OSError:
        pass
    return ranges


def _within(ranges: list[tuple[int, int]], t: torch.Tensor) -> bool:
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    return t.is_contiguous() and any(lo <= start and end <= hi for lo, hi in ranges)


class _PageMap:
    """``madvise`` through libc and the process's own page map (``/proc/self/pagemap``: 8 bytes a page; bit 63 the
    page is present, bit 61 it is a file page — a page written into a private file mapping is not)."""

    PRESENT, FILE = 1 << 63, 1 << 61
    MADV_DONTNEED = 4

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.lock = threading.Lock()
        self._pagemap: Any = None
        self._pid = 0
        try:
            self.libc = ctypes.CDLL(None, use_errno=True)
            self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            self.available = os.access("/proc/self/pagemap", os.R_OK)
        except (OSError, AttributeError):
            self.available = False

    def _own_pagemap(self) -> Any:
        """This process's page map. Opened per process: the file opened as ``/proc/self/pagemap`` describes the
        process that opened it, and the warm run host imports this module before it forks each run's process."""
        if self._pid != os.getpid():
            self._pagemap = open("/proc/self/pagemap", "rb", buffering=0)   # noqa: SIM115 - held for the process
            self._pid = os.getpid()
        return self._pagemap

    def release(self, t: torch.Tensor) -> None:
        """Let go of the whole pages inside ``t``'s bytes, unless one of them holds something the process wrote."""
        start = t.data_ptr()
        first = -(-start // self.page) * self.page
        self._release(first, (start + t.numel() * t.element_size()) // self.page * self.page - first)

    def release_mappings(self, paths: set[str]) -> None:
        """Let go of this process's mappings of the files ``paths`` where nothing was written into them."""
        for start, end in _file_mappings(paths):
            self._release(start, end - start)

    def _release(self, first: int, length: int) -> None:
        if length <= 0:
            return
        with self.lock:                       # one seek-and-read of the page map at a time
            pagemap = self._own_pagemap()
            pagemap.seek(first // self.page * 8)
            entries = np.frombuffer(pagemap.read(length // self.page * 8), dtype=np.uint64)
        written = (entries & np.uint64(self.PRESENT)).astype(bool) & ~(entries & np.uint64(self.FILE)).astype(bool)
        if len(entries) == length // self.page and not written.any():
            self.libc.madvise(first, length, self.MADV_DONTNEED)


_PAGES = _PageMap()
