"""What storing two-byte floats as a raw low plane and a zstd-compressed high plane costs and saves, on real traces.

Every tensor of the given trace directories is read back and written again twice into a scratch directory — whole
(``ekka.trace/2``'s layout) and split (``/3``'s) — through the same shard buffers the capture writes with, then read
back through :class:`~ekka_core.capture.trace.Trace`. Prints, per trace and in total: bytes on disk, the writer's
time in shard writes (the writer thread's work, off the capturing thread) and the time to read every tensor and widen
it to float32 (the aligner's first step), each as a ratio of split over whole measured side by side, and checks every
value read back bit for bit.

    .venv/bin/python benchmarks/trace_codec.py DIAGNOSIS_DIR/traces [--reps 3]

(``DIAGNOSIS_DIR/traces`` of a diagnosis, e.g. ``benchmarks/diagnosis_cost.py --model 1b``'s
``part-2/traces``; a fp32 trace stored over its low-precision sibling is rewritten over that sibling's copy.)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ekka_core.capture import trace as trace_module
from ekka_core.capture.trace import INDEX, TensorRef, Trace, TraceWriter


def _tensors(trace: Trace) -> list[tuple[str, str, torch.Tensor]]:
    """(key, module, tensor as stored: a delta-stored tensor as its difference) of every stored tensor."""
    out, seen = [], set()
    for call in trace.calls:
        for r in (*call.inputs, *call.outputs):
            if isinstance(r, TensorRef) and r.view is None and r.key not in seen:
                seen.add(r.key)
                plain = TensorRef(r.key, r.shard, r.shape, r.dtype, codec=r.codec)    # without its delta base
                out.append((r.key, call.module, trace.tensor(plain)))
    return out


def _write(tensors: list[tuple[str, str, torch.Tensor]], out: Path, run, split: bool) -> tuple[float, list]:
    """Write the tensors as a trace (split or whole); the seconds the writer spent in shard writes, and the refs."""
    spent = []
    original_write = trace_module._ShardBuffer.write

    def timed_write(self, path):
        t0 = time.perf_counter()
        original_write(self, path)
        spent.append(time.perf_counter() - t0)

    saved = trace_module.zstandard
    trace_module._ShardBuffer.write = timed_write
    if not split:
        trace_module.zstandard = None          # split_codec's rule: no zstandard, every tensor whole
    try:
        w = TraceWriter(out, run)
        refs = [w.add_tensor(key, t, module) for key, module, t in tensors]
        w.close(complete=True)
    finally:
        trace_module._ShardBuffer.write = original_write
        trace_module.zstandard = saved
    return sum(spent), refs


def _read(out: Path, refs: list[TensorRef]) -> tuple[float, list[torch.Tensor]]:
    """Every tensor read back, and the seconds it took to read each and widen it to float32 as the aligner does: a
    whole tensor is a view of the mapped file until its pages are touched, so reading alone would time nothing."""
    trace = Trace(out)
    back, spent = [], 0.0
    for r in refs:
        t0 = time.perf_counter()
        t = trace.tensor(r)
        t.float()
        spent += time.perf_counter() - t0
        back.append(t)
    return spent, back


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("shard-*.safetensors"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, help="a diagnosis's traces/ directory (or one trace directory)")
    ap.add_argument("--reps", type=int, default=3, help="alternations of whole and split; medians are printed")
    a = ap.parse_args()
    dirs = [a.traces] if (a.traces / INDEX).exists() else sorted(d for d in a.traces.iterdir() if (d / INDEX).exists())
    if not dirs:
        print(f"{a.traces}: no trace (a directory with {INDEX})", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="ekka-trace-codec-"))
    totals = {"whole": 0, "split": 0}
    print("| trace | tensors | whole MB | split MB | size × | writer s whole | writer s split | write × | "
          "read s whole | read s split | read × |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for d in dirs:
            tensors = _tensors(Trace(d))
            run = Trace(d).run
            times: dict[str, list[tuple[float, float]]] = {"whole": [], "split": []}
            sizes = {}
            for _ in range(a.reps):
                for mode in ("whole", "split"):
                    out = scratch / mode
                    shutil.rmtree(out, ignore_errors=True)
                    write_s, refs = _write(tensors, out, run, split=mode == "split")
                    read_s, back = _read(out, refs)
                    for (key, _, t), b in zip(tensors, back):
                        bits = torch.int16 if t.element_size() == 2 else t.dtype
                        if not torch.equal(t.contiguous().view(bits), b.contiguous().view(bits)):
                            print(f"{d.name}: {key} did not read back bit for bit ({mode})", file=sys.stderr)
                            return 1
                    times[mode].append((write_s, read_s))
                    sizes[mode] = _size(out)
            med = {m: (statistics.median(w for w, _ in v), statistics.median(r for _, r in v)) for m, v in times.items()}
            for m in totals:
                totals[m] += sizes[m]
            print(f"| {d.name} | {len(tensors)} | {sizes['whole'] / 2**20:.0f} | {sizes['split'] / 2**20:.0f} | "
                  f"{sizes['split'] / sizes['whole']:.3f} | {med['whole'][0]:.2f} | {med['split'][0]:.2f} | "
                  f"{med['split'][0] / med['whole'][0]:.2f} | {med['whole'][1]:.2f} | {med['split'][1]:.2f} | "
                  f"{med['split'][1] / med['whole'][1]:.2f} |")
        print(f"\nall traces: {totals['whole'] / 2**20:.0f} MB whole, {totals['split'] / 2**20:.0f} MB split "
              f"({totals['split'] / totals['whole']:.3f}×); every value read back bit for bit")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
