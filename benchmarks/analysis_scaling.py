"""Analysis cost vs trace size: analysis time / time to read the traces once, and peak RSS as the trace grows.

    .venv/bin/python benchmarks/analysis_scaling.py [--root /tmp/ekka-scaling] [--reps 3] [--profile] [--fresh]
    .venv/bin/python benchmarks/analysis_scaling.py --dirs SMALL_OUT LARGE_OUT     # existing `ekka diagnose` outputs

Step 1 (skipped when the outputs exist): two real diagnoses with ``ekka diagnose`` on the zoo's llama made larger
(hidden 1024, 8 layers, bf16, 8 new tokens) — ``small``: 1 prompt; ``large``: 4 different prompts, all exactly
96 tokens long (4× the tokens, hence 4× the trace bytes). Only their traces
(``OUT/traces/{target,reference,reference-fp32}``) are used below.

Step 2, for each size, alternating, ``--reps`` times, each in a fresh child process:
  read     open the 3 traces (``Trace``) and load every tensor of every call once (``Trace.tensor``), copied
           to fp32 (``Trace.tensor`` itself is zero-copy: safetensors maps the shard, so without the copy nothing
           would be read; fp32 because the analysis compares in fp32): the floor any analysis has to pay;
  analyse  the analysis stages only, in ``ekka_core.pipeline.diagnose``'s order, on the existing traces (no
           capture): load + pre-flight, tree ×2, mapping, align (incl. the alignment proof), analysis, report.
Each child (``OMP_NUM_THREADS=--threads``, default 1) imports the same modules, then resets its RSS high-water mark (``/proc/self/clear_refs`` = 5) and
reports wall time, CPU time, peak RSS of the work (VmHWM — ``getrusage`` ru_maxrss cannot be used here: Linux
folds the parent's RSS at fork/exec into a child's ru_maxrss), the RSS right after the imports, sampled peaks of
anonymous and file-backed RSS (the shards are memory-mapped), and how many tensor bytes it loaded through
``Trace.tensor`` (counted by wrapping it in the child; ekka_core is untouched). The analysis children import
ruptures (scipy) before the clock starts: a one-off per-process cost, reported on its own. ``--profile`` adds a
cProfile of the analysis stages on the large traces.

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
    """(CPU seconds, peak RSS MiB). The peak is VmHWM, the high-water mark of this process' own address space:
    ru_maxrss would do, except that Linux folds the parent's RSS at fork/exec time into a child's ru_maxrss."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, _status()["VmHWM"]


def _status() -> dict[str, float]:
    """VmRSS / VmHWM / RssAnon / RssFile of this process, MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024.0
    return out


class _RssSampler:
    """Peak anonymous and file-backed (memory-mapped shards) RSS, sampled every 5 ms in a thread."""

    def __init__(self) -> None:
        import threading
        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            st = _status()
            for k in self.peak:
                self.peak[k] = max(self.peak[k], st[k])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        st = _status()
        return {k: max(v, st[k]) for k, v in self.peak.items()}


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
    fixed = 0.0
    if mode != "read":
        # The change-point detector imports ruptures (and scipy) on first use: a one-off cost per process that
        # does not grow with the trace. Paid here, outside the clock, and reported on its own.
        t = time.perf_counter()
        import ruptures  # noqa: F401
        fixed = time.perf_counter() - t
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                      # reset VmHWM: the peak below is the work's, imports done
    base = _status()["VmRSS"]
    sampler = _RssSampler()
    w0, (c0, _) = time.perf_counter(), _usage()

    def stage(name: str, t: float) -> float:
        now = time.perf_counter()
        stages[name] = now - t
        return now

    if mode == "read":
        import torch
        for role in ROLES:
            tr = trace_mod.Trace(traces / role)
            for call in tr.calls:
                for ref in call.inputs + call.outputs:
                    if isinstance(ref, trace_mod.TensorRef):
                        t = tensor(tr, ref)
                        # Trace.tensor is zero-copy (safetensors maps the shard): copy to touch every byte,
                        # as fp32 since that is what the analysis compares in.
                        t.to(torch.float32 if t.is_floating_point() else t.dtype, copy=True)
    elif mode in ("analyse", "profile"):
        profiler = None
        if mode == "profile":
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        from ekka_core.align import Traces, align
        from ekka_core.analysis import analyse
        from ekka_core.capture import CaptureResult, load
        from ekka_core.mapping import map_components
        from ekka_core.checks.inputs import preflight_inputs
        from ekka_core.report import build_report, write_report
        from ekka_core.contracts.report import RunMeta, Unchecked
        from ekka_core.contracts.serving import EngineOutputs
        from ekka_core.contracts.spec import DiagnosisSpec
        from ekka_core.tree import build_tree

        spec = DiagnosisSpec(**json.loads((traces / "spec.json").read_text())["spec"])
        t = time.perf_counter()
        target, reference, fp32 = load(CaptureResult(traces / "target", traces / "reference",
                                                     traces / "reference-fp32"))
        differ = preflight_inputs(spec, EngineOutputs.load(traces / "target"), reference.run.own_prompt_token_ids)
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
        unchecked = [Unchecked(u.module, u.reason) for u in mapping.unmapped]
        ranking = analyse(aligned, threshold=spec.threshold, dtype=spec.dtype, target_classes=classes,
                          prompt_lens=target.run.prompt_lens, unchecked=unchecked)
        t = stage("analysis (align pairs + ratios)", t)
        import tempfile
        report = build_report(ranking, spec=spec, meta=RunMeta())
        write_report(report, Path(tempfile.mkdtemp(prefix="ekka-scaling-report-")))
        stage("report", t)
        stages["pairs"] = len(ranking.pairs)
        stages["verdict"] = ranking.verdict  # type: ignore[assignment]
        if profiler is not None:
            profiler.disable()
            import io
            import pstats
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(25)
            stages["profile"] = buf.getvalue()  # type: ignore[assignment]
    wall = time.perf_counter() - w0
    cpu, rss = _usage()
    peaks = sampler.stop()
    print("EKKA_RESULT " + json.dumps({"mode": mode, "wall": wall, "cpu": cpu - c0, "rss_mib": rss, "import_s": fixed,
                                       "base_mib": base, "anon_peak_mib": peaks["RssAnon"],
                                       "file_peak_mib": peaks["RssFile"],
                                       "bytes": counted["bytes"], "tensors": counted["tensors"],
                                       "stages": stages}), flush=True)


# --------------------------------------------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------------------------------------------
def run_child(mode: str, out: Path, threads: int = 1) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, __file__, "--child", mode, str(out)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)
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
    ap.add_argument("--profile", action="store_true", help="also cProfile the analysis of the large traces")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch/OpenMP threads in the children (default 1: on a shared 2-core box, OpenMP threads "
                         "spin against other processes and inflate both wall and CPU time 10x or more at random)")
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
                with open(p, "rb") as f:
                    while f.read(64 << 20):
                        pass
    modes = ("read", "analyse")
    results: dict[tuple[str, str], list[dict]] = {}
    for rep in range(a.reps):
        for size, out in sizes.items():
            for mode in modes:
                r = run_child(mode, out, a.threads)
                results.setdefault((size, mode), []).append(r)
                print(f"  rep {rep} {size:5s} {mode:8s} wall {r['wall']:7.3f} s  cpu {r['cpu']:7.3f} s  "
                      f"peak RSS {r['rss_mib']:6.0f} MiB (after imports {r['base_mib']:4.0f})  "
                      f"loaded {r['bytes'] / 2**20:7.1f} MiB", flush=True)

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
    print("medians; peak = VmHWM reset after imports; 'work' = peak - RSS after imports; anon/file = sampled peaks of")
    print("RssAnon (heap) and RssFile (incl. memory-mapped shards)")
    print(f"{'':6s}{'mode':9s}{'wall s':>8s}{'cpu s':>8s}{'peak MiB':>10s}{'work MiB':>10s}{'anon MiB':>10s}"
          f"{'file MiB':>10s}{'loaded MiB':>12s}")
    for size in sizes:
        for mode in modes:
            print(f"{size:6s}{mode:9s}{m(size, mode, 'wall'):8.2f}{m(size, mode, 'cpu'):8.2f}"
                  f"{m(size, mode, 'rss_mib'):10.0f}{m(size, mode, 'rss_mib') - m(size, mode, 'base_mib'):10.0f}"
                  f"{m(size, mode, 'anon_peak_mib'):10.0f}{m(size, mode, 'file_peak_mib'):10.0f}"
                  f"{m(size, mode, 'bytes') / 2**20:12.1f}")
    print()
    print("analysis stages (median wall s):")
    names = [k for k in results[("small", "analyse")][0]["stages"] if k not in ("pairs", "verdict")]
    for size in sizes:
        print(f"  {size:6s} " + "  ".join(
            f"{n} {med([r['stages'][n] for r in results[(size, 'analyse')]]):.3f}" for n in names))
    print()
    imp = med([r["import_s"] for v in results.values() for r in v if r["mode"] == "analyse"])
    print(f"one-off import of ruptures/scipy (first change-point detection): {imp:.2f} s — not in the times above")
    print()
    print("analysis / read once (goal <= 3x): per rep, analyse and read of the same size run back to back; median "
          "over reps, and the ratio of the fastest runs (least disturbed by other load)")
    for size in sizes:
        per_rep = [an["wall"] / rd["wall"] for an, rd in zip(results[(size, "analyse")], results[(size, "read")])]
        per_rep_imp = [(an["wall"] + an["import_s"]) / rd["wall"]
                       for an, rd in zip(results[(size, "analyse")], results[(size, "read")])]
        best = min(r["wall"] for r in results[(size, "analyse")]) / min(r["wall"] for r in results[(size, "read")])
        best_cpu = min(r["cpu"] for r in results[(size, "analyse")]) / min(r["cpu"] for r in results[(size, "read")])
        loaded = m(size, "analyse", "bytes") / max(m(size, "read", "bytes"), 1)
        print(f"  {size:6s} median {med(per_rep):.1f}x, fastest {best:.1f}x (CPU {best_cpu:.1f}x); with the ruptures "
              f"import {med(per_rep_imp):.1f}x; analysis loads {loaded:.2f}x the trace's tensor bytes")
    grow = trace_bytes(large) / trace_bytes(small)
    print(f"trace bytes large / small: {grow:.2f}x; analysis time large / small: median "
          f"{m('large', 'analyse', 'wall') / m('small', 'analyse', 'wall'):.2f}x, fastest "
          f"{min(r['wall'] for r in results[('large', 'analyse')]) / min(r['wall'] for r in results[('small', 'analyse')]):.2f}x")
    print()
    for mode in modes:
        r = m("large", mode, "rss_mib") / m("small", mode, "rss_mib")
        ws = m("small", mode, "rss_mib") - m("small", mode, "base_mib")
        wl = m("large", mode, "rss_mib") - m("large", mode, "base_mib")
        print(f"peak RSS large / small ({mode:8s}): {r:.2f}x (goal <= 1.2x); above the imports "
              f"{ws:.0f} -> {wl:.0f} MiB ({wl / max(ws, 1):.2f}x); heap (RssAnon) "
              f"{m('large', mode, 'anon_peak_mib') / m('small', mode, 'anon_peak_mib'):.2f}x, mapped shards (RssFile) "
              f"{m('large', mode, 'file_peak_mib') / m('small', mode, 'file_peak_mib'):.2f}x")
    if a.profile:
        r = run_child("profile", large, a.threads)
        print("\ncProfile of the analysis stages on the large traces (own time):")
        print(r["stages"]["profile"])


if __name__ == "__main__":
    main()
