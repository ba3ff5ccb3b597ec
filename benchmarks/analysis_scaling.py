"""Analysis cost vs trace size: analysis time / time to read the traces once, and peak RSS as the trace grows.

    .venv/bin/python benchmarks/analysis_scaling.py [--root /tmp/ekka-scaling] [--reps 3] [--fresh]
    .venv/bin/python benchmarks/analysis_scaling.py --dirs SMALL_OUT LARGE_OUT     # existing `ekka diagnose` outputs

Step 1 (skipped when the outputs exist): two real diagnoses with ``ekka diagnose`` on the zoo's llama made larger
(hidden 1024, 8 layers, bf16, 8 new tokens) — ``small``: 1 prompt; ``large``: 4 different prompts, all exactly
96 tokens long (4× the tokens, hence 4× the trace bytes). Only their traces
(``OUT/traces/{target,reference,reference-fp32}``) are used below.

Step 2, for each size, alternating, ``--reps`` times, each in a fresh child process (so ru_maxrss is its own):
  read     open the 3 traces (``Trace``) and load every tensor of every call once (``Trace.tensor``): the floor
           any analysis has to pay;
  analyse  the analysis stages only, in ``ekka_core.pipeline.diagnose``'s order, on the existing traces (no
           capture): load + pre-flight, tree ×2, mapping, align (incl. the alignment proof), analysis, report;
  import   imports the same modules and stops: the fixed RSS of the interpreter + torch, subtracted to show
           what the data itself costs.
Each child reports wall time, CPU time, peak RSS (``resource.getrusage`` maxrss) and how many tensor bytes it
loaded through ``Trace.tensor`` (counted by wrapping it in the child; ekka_core is untouched).

Goals (issue): analysis ≤ 3× the read time; peak RSS flat (≤ 1.2×) when the trace grows 4×.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

OVERRIDES = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
             "num_key_value_heads": 4, "head_dim": 64}
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. A serving engine answers a prompt token by token. "
    "Silent errors do not crash: the model still answers, but worse. Attention looks back over the context window.",
    "Sliding window attention only sees the most recent tokens, while global attention sees them all. "
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in many prompts, as do questions and answers here.",
    "A serving engine answers a prompt token by token. The quick brown fox jumps over the lazy dog again. "
    "Attention looks back over the context window; the model still answers, but worse, and nobody notices.",
    "Silent errors do not crash. Numbers like 0 1 2 3 4 5 6 7 8 9 10 appear in many prompts, as do questions. "
    "Global attention sees all the tokens, while sliding window attention only sees the most recent ones.",
]
MAX_NEW_TOKENS = 8
PROMPT_TOKENS = 96


def equal_length_prompts(model: str, n: int, tokens: int = PROMPT_TOKENS) -> list[str]:
    """``n`` different prompts of exactly ``tokens`` token ids each (BOS included): words of a rotated text are
    appended while they fit, so every prompt differs but all have the same length."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    words = " ".join(PROMPTS).split()
    out = []
    for i in range(n):
        rotated = (words[i * 7:] + words[:i * 7]) * 4
        text = ""
        for w in rotated:
            cand = f"{text} {w}".strip()
            k = len(tok(cand)["input_ids"])
            if k <= tokens:
                text = cand
            if k == tokens:
                break      # a word that overshoots is skipped; a shorter one later may fit exactly
        if len(tok(text)["input_ids"]) != tokens:
            raise SystemExit(f"could not build a prompt of exactly {tokens} tokens")
        out.append(text)
    return out
ROLES = ("target", "reference", "reference-fp32")


# --------------------------------------------------------------------------------------------------------------
# child
# --------------------------------------------------------------------------------------------------------------
def _usage() -> tuple[float, float]:
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_maxrss / 1024.0


def child(mode: str, out: Path) -> None:
    import torch  # noqa: F401 - part of the fixed cost in every mode

    from ekka_core.capture import trace as trace_mod
    from ekka_core import pipeline  # noqa: F401 - same imports in every mode

    counted = {"bytes": 0, "tensors": 0}
    original = trace_mod.Trace.tensor

    def tensor(self, ref):  # noqa: ANN001
        t = original(self, ref)
        counted["bytes"] += t.numel() * t.element_size()
        counted["tensors"] += 1
        return t

    trace_mod.Trace.tensor = tensor
    traces = out / "traces"
    stages: dict[str, float] = {}
    w0, (c0, _) = time.perf_counter(), _usage()

    def stage(name: str, t: float) -> float:
        now = time.perf_counter()
        stages[name] = now - t
        return now

    if mode == "read":
        for role in ROLES:
            tr = trace_mod.Trace(traces / role)
            for call in tr.calls:
                for ref in call.inputs + call.outputs:
                    if isinstance(ref, trace_mod.TensorRef):
                        tensor(tr, ref)
    elif mode == "analyse":
        from ekka_core.align import Traces, align
        from ekka_core.analysis import analyse
        from ekka_core.capture import CaptureResult, load
        from ekka_core.mapping import map_components
        from ekka_core.pipeline import preflight_inputs
        from ekka_core.report import build_report, write_report
        from ekka_core.spec import DiagnosisSpec
        from ekka_core.tree import build_tree

        spec = DiagnosisSpec(**json.loads((traces / "spec.json").read_text())["spec"])
        t = time.perf_counter()
        target, reference, fp32 = load(CaptureResult(traces / "target", traces / "reference",
                                                     traces / "reference-fp32"))
        differ = preflight_inputs(target, reference)
        if differ:
            raise SystemExit(f"inputs differ in {out}: nothing to analyse")
        t = stage("load+preflight", t)
        t_tree, r_tree = build_tree(target), build_tree(reference)
        t = stage("tree", t)
        mapping = map_components(t_tree, r_tree)
        t = stage("mapping", t)
        aligned = align(mapping, Traces(target, reference, fp32))
        t = stage("align (proof)", t)
        classes = {name: {"cls": n.cls, "file": n.class_file, "line": n.class_line, "forward_file": n.forward_file,
                          "forward_line": n.forward_line} for name, n in t_tree.modules.items()}
        unchecked = [{"module": u.module, "reason": u.reason} for u in mapping.unmapped]
        ranking = analyse(aligned, threshold=spec.threshold, dtype=spec.dtype, target_classes=classes,
                          prompt_lens=target.run.prompt_lens, unchecked=unchecked)
        t = stage("analysis (align pairs + ratios)", t)
        import tempfile
        report = build_report(ranking, spec=spec.to_json(), meta={"benchmark": True})
        write_report(report, Path(tempfile.mkdtemp(prefix="ekka-scaling-report-")))
        stage("report", t)
        stages["pairs"] = len(ranking.pairs)
        stages["verdict"] = ranking.verdict  # type: ignore[assignment]
    wall = time.perf_counter() - w0
    cpu, rss = _usage()
    print("EKKA_RESULT " + json.dumps({"mode": mode, "wall": wall, "cpu": cpu - c0, "rss_mib": rss,
                                       "bytes": counted["bytes"], "tensors": counted["tensors"],
                                       "stages": stages}), flush=True)


# --------------------------------------------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------------------------------------------
def run_child(mode: str, out: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", mode, str(out)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("EKKA_RESULT "):
            return json.loads(line[len("EKKA_RESULT "):])
    sys.stderr.write(proc.stderr[-4000:])
    raise SystemExit(f"child {mode} {out} failed (exit {proc.returncode})")


def make(out: Path, n_prompts: int, fresh: bool) -> None:
    from ekka_core.zoo import build_model

    if (out / "traces" / "spec.json").exists() and not fresh:
        print(f"reusing the traces in {out}", flush=True)
        return
    model = str(build_model("llama", overrides=OVERRIDES))
    prompts = equal_length_prompts(model, n_prompts)
    ekka = Path(sys.executable).with_name("ekka")
    cmd = [str(ekka), "diagnose", "--model", model, "--dtype", "bfloat16", "--max-new-tokens", str(MAX_NEW_TOKENS),
           "--out", str(out)] + [x for p in prompts for x in ("--prompt", p)] + (["--fresh"] if fresh else [])
    print("$ " + " ".join(cmd[:8]) + f" ... ({len(prompts)} prompt(s))", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd).returncode
    print(f"  exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
    if not (out / "traces" / "spec.json").exists():
        raise SystemExit(f"ekka diagnose wrote no complete traces under {out}")


def trace_bytes(out: Path) -> int:
    return sum(p.stat().st_size for role in ROLES for p in (out / "traces" / role).glob("*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("/tmp/ekka-scaling"))
    ap.add_argument("--dirs", type=Path, nargs=2, metavar=("SMALL", "LARGE"),
                    help="existing `ekka diagnose --out` directories to use instead of making them")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fresh", action="store_true", help="re-capture the traces")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], Path(a.child[1]))
        return

    if a.dirs:
        small, large = a.dirs
    else:
        small, large = a.root / "small", a.root / "large"
        make(small, 1, a.fresh)
        make(large, 4, a.fresh)

    sizes = {"small": small, "large": large}
    for out in sizes.values():   # warm the page cache once so neither mode pays the cold disk read
        for role in ROLES:
            for p in (out / "traces" / role).glob("*"):
                p.read_bytes()
    results: dict[tuple[str, str], list[dict]] = {}
    for rep in range(a.reps):
        for size, out in sizes.items():
            for mode in ("import", "read", "analyse"):
                r = run_child(mode, out)
                results.setdefault((size, mode), []).append(r)
                print(f"  rep {rep} {size:5s} {mode:7s} wall {r['wall']:7.3f} s  cpu {r['cpu']:7.3f} s  "
                      f"peak RSS {r['rss_mib']:6.0f} MiB  loaded {r['bytes'] / 2**20:7.1f} MiB", flush=True)

    med = statistics.median

    def m(size: str, mode: str, key: str) -> float:
        return med([r[key] for r in results[(size, mode)]])

    print()
    for size, out in sizes.items():
        tr = __import__("ekka_core.capture.trace", fromlist=["Trace"]).Trace(out / "traces" / "target")
        tokens = sum(len(t) for t in tr.run.token_ids)
        an = results[(size, "analyse")][0]
        print(f"{size}: {out}  {len(tr.run.prompts)} prompt(s), {tokens} target tokens, 3 traces "
              f"{trace_bytes(out) / 2**20:.1f} MiB on disk, {an['stages']['pairs']} compared pairs, "
              f"verdict {an['stages']['verdict']}")
    print()
    hdr = f"{'':7s}{'mode':9s}{'wall s':>9s}{'cpu s':>9s}{'peak RSS MiB':>14s}{'RSS - import':>14s}{'loaded MiB':>12s}"
    print(hdr)
    for size in sizes:
        base = m(size, "import", "rss_mib")
        for mode in ("import", "read", "analyse"):
            print(f"{size:7s}{mode:9s}{m(size, mode, 'wall'):9.3f}{m(size, mode, 'cpu'):9.3f}"
                  f"{m(size, mode, 'rss_mib'):14.0f}{m(size, mode, 'rss_mib') - base:14.0f}"
                  f"{m(size, mode, 'bytes') / 2**20:12.1f}")
    print()
    print("analysis stages (median wall s):")
    names = [k for k in results[("small", "analyse")][0]["stages"] if k not in ("pairs", "verdict")]
    for size in sizes:
        print(f"  {size:6s} " + "  ".join(
            f"{n} {med([r['stages'][n] for r in results[(size, 'analyse')]]):.3f}" for n in names))
    print()
    for size in sizes:
        ratio = m(size, "analyse", "wall") / m(size, "read", "wall")
        cpu_ratio = m(size, "analyse", "cpu") / m(size, "read", "cpu")
        loaded = m(size, "analyse", "bytes") / max(m(size, "read", "bytes"), 1)
        print(f"{size:6s} analysis / read once: wall {ratio:.2f}x, CPU {cpu_ratio:.2f}x (goal <= 3x); analysis loads "
              f"{loaded:.2f}x the trace bytes")
    grow = trace_bytes(large) / trace_bytes(small)
    for mode in ("read", "analyse"):
        r = m("large", mode, "rss_mib") / m("small", mode, "rss_mib")
        d_small = m("small", mode, "rss_mib") - m("small", "import", "rss_mib")
        d_large = m("large", mode, "rss_mib") - m("large", "import", "rss_mib")
        print(f"peak RSS large / small ({mode:7s}): {r:.2f}x (goal <= 1.2x) with trace bytes {grow:.2f}x; "
              f"above the import baseline {d_small:.0f} -> {d_large:.0f} MiB ({d_large / max(d_small, 1):.2f}x)")


if __name__ == "__main__":
    main()
