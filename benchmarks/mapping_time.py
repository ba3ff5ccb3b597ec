"""Mapping time per architecture: Model Trees from existing traces, then the rule-based mapper.

    .venv/bin/python benchmarks/mapping_time.py OUTDIR [OUTDIR ...]    # OUTDIRs of `ekka diagnose` runs

Prints, per diagnosis, the tree-building time (reads only the trace index) and the mapping time, and whether the
mapping is complete (validator passes). Reading tensors is not part of either.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ekka_core.capture.trace import Trace
from ekka_core.mapping import map_components
from ekka_core.tree import build_tree


def main(dirs: list[str]) -> None:
    print(f"{'diagnosis':<28} {'arch':<22} {'tree s':>8} {'mapping s':>10} {'pairs':>6} {'complete':>9}")
    for d in dirs:
        t0 = time.perf_counter()
        target, reference = Trace(Path(d) / "traces/target"), Trace(Path(d) / "traces/reference")
        t_tree, r_tree = build_tree(target), build_tree(reference)
        t1 = time.perf_counter()
        mapping = map_components(t_tree, r_tree)
        t2 = time.perf_counter()
        arch = target.run.declared.get("model_class", "?").rsplit(".", 1)[-1]
        print(f"{Path(d).name:<28} {arch:<22} {t1 - t0:>8.3f} {t2 - t1:>10.4f} {len(mapping.pairs):>6} "
              f"{str(not mapping.validate(t_tree)):>9}")


if __name__ == "__main__":
    main(sys.argv[1:])
