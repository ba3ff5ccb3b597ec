"""What diagnosing the served configuration costs: the symptom check alone, a full diagnosis whose traced baseline
already reproduces the symptom, and one that needs configuration triage over k configurations.

Measured side by side in one run, each in a fresh output directory (nothing reused), as wall time and the peak RSS of
the processes each one started (engine, reference, scoring: ``RUSAGE_CHILDREN`` high-water mark, read after each
part in its own subprocess so parts do not share a maximum). Figures are printed as a table and as ratios to the
symptom check alone. Not a test: it runs real engines for minutes.

    .venv/bin/python benchmarks/serving_cost.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PART = r"""
import json, resource, sys, time
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
    report = diagnose(spec, out, env=env, fresh=True).report
    triage = report.serving.triage if report.serving else None
    runs = sorted(p.name for p in (out / "runs").iterdir())
    extra = {"verdict": report.verdict, "untraced_runs": len(runs), "trials": len(triage.trials) if triage else 0,
             "culprit": triage.culprit if triage else None,
             "traced_configurations": 1 + bool(triage and triage.traced_under)}
print(json.dumps({"seconds": round(time.perf_counter() - t0, 1),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1), **extra}))
"""

PARTS = [("symptom check alone (served run + reference scoring)", "symptom", "decode-attention-kernel-wrong-scale"),
         ("diagnosis, traced baseline reproduces", "diagnose", "decode-attention-kernel-wrong-scale"),
         ("diagnosis with triage (prefix caching)", "diagnose", "prefix-cache-hit-corrupts-resumed-prefill")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("ekka-out/serving-cost"))
    args = ap.parse_args()
    rows = []
    for title, part, case in PARTS:
        out = args.out / f"{part}-{case}"
        proc = subprocess.run([sys.executable, "-c", PART, part, case, str(out)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{title}: failed\n{proc.stderr[-2000:]}")
            return 1
        rows.append((title, case, json.loads(proc.stdout.strip().splitlines()[-1])))
        print(title, rows[-1][2], flush=True)
    base = rows[0][2]["seconds"]
    print("\n| part | case | wall s | × symptom check | peak RSS MB | untraced runs | trials |")
    print("|---|---|---|---|---|---|---|")
    for title, case, r in rows:
        print(f"| {title} | {case} | {r['seconds']} | {r['seconds'] / base:.2f} | {r['peak_rss_mb']} | "
              f"{r.get('untraced_runs', 1)} | {r.get('trials', 0)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
