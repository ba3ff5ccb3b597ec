"""What diagnosing the served configuration costs: the symptom check alone, a full diagnosis whose traced baseline
already reproduces the symptom, and one that needs configuration triage over k configurations.

Measured side by side in one run, each in a fresh output directory (no run reused), as seconds and the peak of the
summed RSS of each part's process tree (engine, reference, scoring, the warm host's children; sampled). Ratios are
to the case's cold served run (a served run + scoring whose vLLM and Inductor compile caches are empty: what the
user's first run of that configuration costs), with each triage trial's own seconds (its engine run and scoring).
Not a test: it runs real engines for minutes.

    .venv/bin/python benchmarks/serving_cost.py [--out DIR]
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

sys.path.insert(0, str(Path(__file__).parent))
from diagnosis_cost import TreePeak  # noqa: E402 - the process tree's summed RSS, sampled

PART = r"""
import json, sys, time
from pathlib import Path
from ekka_core import bugs
from ekka_core.bench import spec_for
from ekka_core.capture import run_engine
from ekka_core.capture.vllm_config import served_args
from ekka_core.pipeline import diagnose
from ekka_core.symptom import check_symptom
from ekka_core.zoo import build_model

part, case, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
bug = bugs.get(case)
spec = spec_for(bug, build_model(bug.arch, overrides=bug.zoo_overrides or None), 4)
env = {bugs.ENV_VAR: bug.name}
t0 = time.perf_counter()
extra = {}
if part == "symptom":
    args, _ = served_args(spec)
    run = run_engine(spec, out / "served", args, label="served", fresh=True, env=env)
    extra["diverges"] = check_symptom(run.outputs, run.scores, threshold=2.0).diverges
else:
    said = []       # (seconds since start, message): where each trial begins and ends
    report = diagnose(spec, out, env=env, fresh=True,
                      progress=lambda stage, msg: said.append((time.perf_counter() - t0, msg))).report
    triage = report.serving.triage if report.serving else None
    runs = sorted(p.name for p in (out / "runs").iterdir())
    # A trial: from "running vllm untraced (trial …" to the progress message after its symptom words.
    starts = [i for i, (_, m) in enumerate(said) if m.startswith("running vllm untraced (trial")
              or m.startswith("running vllm untraced (culprit")]
    trial_s = [round(said[i + 3][0] - said[i][0], 1) if i + 3 < len(said) else None for i in starts]
    extra = {"verdict": report.verdict, "untraced_runs": len(runs), "trials": len(triage.trials) if triage else 0,
             "culprit": triage.culprit if triage else None, "trial_s": trial_s,
             "traced_configurations": 1 + bool(triage and triage.traced_under)}
print(json.dumps({"seconds": round(time.perf_counter() - t0, 1), **extra}))
"""

# (title, part, case). The caches are the benchmark's own (--out/vllm-cache, --out/inductor-cache), empty at the
# start: each case's first served run compiles (its injection compiles into a cache root of its own), later parts
# of that case find what it compiled — as a user's second run of a configuration does.
DECODE, PREFIX = "decode-attention-kernel-wrong-scale", "prefix-cache-hit-corrupts-resumed-prefill"
PARTS = [("served run + scoring, compile cache empty (cold)", "symptom", DECODE),
         ("symptom check alone (served run + scoring), cache filled", "symptom", DECODE),
         ("diagnosis, traced baseline reproduces", "diagnose", DECODE),
         ("served run + scoring, compile cache empty (cold)", "symptom", PREFIX),
         ("diagnosis with triage (prefix caching)", "diagnose", PREFIX)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("ekka-out/serving-cost"))
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    caches = {"VLLM_CACHE_ROOT": str((args.out / "vllm-cache").resolve()),
              "TORCHINDUCTOR_CACHE_DIR": str((args.out / "inductor-cache").resolve())}
    rows = []
    for i, (title, part, case) in enumerate(PARTS):
        out = args.out / f"part-{i}-{part}-{case}"
        proc = subprocess.Popen([sys.executable, "-c", PART, part, case, str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **caches})
        peak = TreePeak(proc.pid)
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            print(f"{title}: failed\n{stderr[-2000:]}")
            return 1
        rows.append((title, case, {**json.loads(stdout.strip().splitlines()[-1]),
                                   "peak_rss_mb": round(peak.stop()[0] / 2**20)}))
        print(title, rows[-1][2], flush=True)
    cold = {case: r["seconds"] for title, case, r in rows if "(cold)" in title}
    print("\n| part | case | s | × the case's cold served run | peak RSS MB (process tree) | untraced runs | trials "
          "| each trial s (× cold served run) |")
    print("|---|---|---|---|---|---|---|---|")
    for title, case, r in rows:
        c = cold[case]
        each = ", ".join(f"{t} ({t / c:.2f})" for t in r.get("trial_s") or [] if t is not None) or "—"
        print(f"| {title} | {case} | {r['seconds']} | {r['seconds'] / c:.2f} | {r['peak_rss_mb']} | "
              f"{r.get('untraced_runs', 1)} | {r.get('trials', 0)} | {each} |")
    return 0

if __name__ == "__main__":
    sys.exit(main())
