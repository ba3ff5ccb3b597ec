"""Capture overhead of tracing the vLLM target: traced / untraced generate time, trace bytes per token, peak RSS.

    .venv/bin/python benchmarks/capture_overhead.py [--runs 2] [--reps 3] [--threads 1] [--prompt-tokens 128]
                                                    [--max-new-tokens 8] [--profile] [--keep DIR]
                                                    [--trace-positions RANGES]

Model: the zoo's llama made larger (hidden 1024, 8 layers, 16 heads, 4 KV heads, head_dim 64, intermediate 2816),
bf16, one prompt of exactly ``--prompt-tokens`` token ids (fed as ids, so its length is exact), greedy,
``--max-new-tokens`` new tokens (prefill + max_new_tokens-1 decode steps are traced).

Each of ``--runs`` child processes (VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_CPU_KVCACHE_SPACE=1, engine built with
``ekka_core.capture.vllm_runner.engine_args``, so the engine runs in the child and ru_maxrss is the engine's;
after the engine is built the forward's thread count is set to ``--threads``):

  1. warms up with one untraced ``llm.generate``;
  2. times an untraced ``generate`` (U0); peak RSS of that untraced generation (VmHWM, reset after the engine
     was built with /proc/self/clear_refs);
  3. ``--reps`` times: start tracing exactly as ``vllm_runner.run`` does
     (``collective_rpc("ekka_trace_control", ("start", dir, run_info))``), time ``generate`` (T_k), close it the
     same way (``("close", …)``: last shard + index.json written; timed separately), then time an untraced
     ``generate`` (U_k+1);
  4. reads VmHWM again (reset after step 2): the peak of the traced phase. ru_maxrss (whole process, engine
     start-up included) is printed too.

Each traced run is compared with the untraced runs just before and after it, ratio_k = T_k / mean(U_k, U_k+1),
so drift from other load on the machine cancels; the medians over all pairs are printed, in wall time and in
process CPU time (user+sys, less sensitive to other processes competing for the cores).

``--profile`` adds three more child processes that isolate where the traced time goes, by monkeypatching
``TraceWriter`` in the child only (ekka_core itself is untouched):
  hooks-only   hooks fire (index, class-source lookup, in-place mutation checksums), but ``add_tensor`` stores
               nothing (no clone, no write);
  clone-only   tensors are cloned to CPU as usual but the shards are never written to disk;
  cprofile     the traced generate+close runs under cProfile; own time is summed by category (model compute,
               clone, mutation checksum, safetensors, class-source lookup, index, Ekka's hook code).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OVERRIDES = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
             "num_key_value_heads": 4, "head_dim": 64}
TEXT = ("The quick brown fox jumps over the lazy dog. A serving engine answers a prompt token by token. "
        "Silent errors do not crash: the model still answers, but worse. ") * 40


# --------------------------------------------------------------------------------------------------------------
# child
# --------------------------------------------------------------------------------------------------------------
def _maxrss_mib() -> float:
    """Whole-process peak (ru_maxrss; Linux folds the parent's RSS at fork/exec into it — the parent is small)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: KiB


def _hwm_mib() -> float:
    """Peak RSS since the last :func:`_hwm_reset` (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024.0


def _hwm_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _patch(variant: str) -> None:
    from ekka_core.capture import trace as trace_mod

    if variant == "hooks-only":
        def add_tensor(self, key, t):  # noqa: ANN001 - same signature as TraceWriter.add_tensor
            return trace_mod.TensorRef(key=key, shard=0, shape=list(t.shape),
                                       dtype=str(t.dtype).removeprefix("torch."))
        trace_mod.TraceWriter.add_tensor = add_tensor
    elif variant == "clone-only":
        def _flush(self):  # noqa: ANN001
            self._pending = {}
            self._pending_bytes = 0
        # Cloned tensors stay pending until a shard is due, as with the real writer; they are just never saved.
        trace_mod.TraceWriter._flush = _flush


def _cpu_s() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# Where the time of a profiled traced run goes: (category, predicate on (file, function name)).
CATEGORIES = [
    ("model compute (oneDNN matmuls)", lambda f, n: "onednn" in n),
    ("clone to CPU (Tensor.to/contiguous/clone)", lambda f, n: n in ("<method 'to' of 'torch._C.TensorBase' objects>",
                                                                    "<method 'contiguous' of 'torch._C.TensorBase' objects>",
                                                                    "<method 'clone' of 'torch._C.TensorBase' objects>")),
    ("in-place mutation checksum (double().sum())", lambda f, n: n in (
        "<method 'double' of 'torch._C.TensorBase' objects>", "<method 'sum' of 'torch._C.TensorBase' objects>")),
    ("safetensors serialisation", lambda f, n: "serialize" in n or "safetensors" in f),
    ("class source lookup (inspect/ast/tokenize)", lambda f, n: any(m in f for m in ("inspect.py", "ast.py",
                                                                                      "tokenize.py", "linecache"))
     or n == "<built-in method builtins.compile>"),
    ("index building (asdict/json)", lambda f, n: "dataclasses.py" in f or "json" in f),
    ("Ekka hook Python (hooks.py/trace.py own time)", lambda f, n: "ekka_core" in f),
]


def _categorise(profiler) -> list[tuple[str, float]]:  # noqa: ANN001
    import pstats
    st = pstats.Stats(profiler)
    total = sum(v[2] for v in st.stats.values())
    sums = {c: 0.0 for c, _ in CATEGORIES}
    for (f, _line, n), v in st.stats.items():
        for c, pred in CATEGORIES:
            if pred(f, n):
                sums[c] += v[2]
                break
    return [(c, t) for c, t in sums.items()] + [("everything else (vLLM, torch ops, Python)",
                                                  total - sum(sums.values())), ("total (profiled)", total)]


def child(cfg: dict) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    from dataclasses import asdict

    import vllm
    from vllm import LLM, SamplingParams

    from ekka_core.capture.trace import RunInfo
    from ekka_core.capture.vllm_config import configuration, served_args
    from ekka_core.contracts.spec import DiagnosisSpec

    variant = cfg["variant"]
    if variant in ("hooks-only", "clone-only"):
        _patch(variant)
    spec = DiagnosisSpec(model=cfg["model"], prompts=["(token ids)"], dtype="bfloat16",
                         max_new_tokens=cfg["max_new_tokens"])
    args, _ = configuration(served_args(spec)[0], None)     # the traced baseline's arguments
    llm = LLM(**args)
    if cfg.get("threads"):
        import torch
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op once it has bound its OpenMP threads;
        # the in-process engine runs the forward on this thread, so the underlying setter still applies.
        torch._C.set_num_threads(cfg["threads"])
    prompt = [{"prompt_token_ids": cfg["prompt_ids"]}]
    params = SamplingParams(temperature=0.0, max_tokens=cfg["max_new_tokens"], ignore_eos=True)
    info = asdict(RunInfo(framework="vllm", framework_version=vllm.__version__, role="target", model=spec.model,
                          dtype=spec.dtype, engine_args={k: v for k, v in args.items() if k != "model"},
                          prompts=list(spec.prompts)))

    def untraced() -> dict:
        w0, c0 = time.perf_counter(), _cpu_s()
        llm.generate(prompt, params, use_tqdm=False)
        return {"wall": time.perf_counter() - w0, "cpu": _cpu_s() - c0}

    def traced(out_dir: Path, profiler=None) -> dict:  # noqa: ANN001
        if profiler is not None:
            profiler.enable()
        w0, c0 = time.perf_counter(), _cpu_s()
        llm.collective_rpc("ekka_trace_control", args=("start", str(out_dir), info, cfg["options"]))
        w1 = time.perf_counter()
        outputs = llm.generate(prompt, params, use_tqdm=False)
        w2, c2 = time.perf_counter(), _cpu_s()
        prompt_ids = [list(o.prompt_token_ids) for o in outputs]
        generated = [list(o.outputs[0].token_ids) for o in outputs]
        token_ids = [p + g[:-1] for p, g in zip(prompt_ids, generated)]
        seq_by_req = {o.request_id: i for i, o in enumerate(outputs)}
        stats = llm.collective_rpc("ekka_trace_control", args=(
            "close", seq_by_req, [len(p) for p in prompt_ids], token_ids, generated, prompt_ids, None))
        w3, c3 = time.perf_counter(), _cpu_s()
        if profiler is not None:
            profiler.disable()
        shards = sorted(out_dir.glob("shard-*.safetensors"))
        index = out_dir / "index.json"
        return {"wall": w2 - w1, "start": w1 - w0, "close": w3 - w2, "cpu": c2 - c0, "cpu_close": c3 - c2,
                "tokens": sum(len(t) for t in token_ids), "shard_bytes": sum(p.stat().st_size for p in shards),
                "shards": len(shards), "index_bytes": index.stat().st_size if index.exists() else 0,
                "calls": stats[0]["calls"], "steps": stats[0]["steps"]}

    rss_engine = _maxrss_mib()                        # engine built (weights loaded, KV cache allocated)
    _hwm_reset()
    untraced()                                        # warm-up, untraced
    runs_u = [untraced()]
    rss_untraced = _hwm_mib()                         # peak of untraced generation, nothing traced yet
    _hwm_reset()
    runs_t = []
    profiler = None
    if variant == "cprofile":
        import cProfile
        profiler = cProfile.Profile()
    for k in range(cfg["reps"]):
        runs_t.append(traced(Path(cfg["out_dir"]) / f"rep-{k}", profiler))
        runs_u.append(untraced())
    result = {"variant": variant, "untraced": runs_u, "traced": runs_t, "rss_untraced_mib": rss_untraced,
              "rss_traced_mib": _hwm_mib(), "rss_engine_mib": rss_engine, "rss_process_mib": _maxrss_mib(),
              "torch_threads": _threads()}
    if profiler is not None:
        result["categories"] = _categorise(profiler)
        import io
        import pstats
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(15)
        result["profile"] = buf.getvalue()
    print("EKKA_RESULT " + json.dumps(result), flush=True)


def _threads() -> int:
    import torch
    return torch.get_num_threads()


# --------------------------------------------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------------------------------------------
def run_child(cfg: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("EKKA_RESULT "):
            return json.loads(line[len("EKKA_RESULT "):])
    sys.stderr.write(proc.stderr[-4000:])
    raise SystemExit(f"child {cfg['variant']} failed (exit {proc.returncode})")


def ratios(r: dict) -> list[dict]:
    """One entry per traced generate, against the mean of the untraced runs just before and after it."""
    out = []
    for k, t in enumerate(r["traced"]):
        before, after = r["untraced"][k], r["untraced"][k + 1]
        u_wall, u_cpu = (before["wall"] + after["wall"]) / 2, (before["cpu"] + after["cpu"]) / 2
        out.append({"u": u_wall, "t": t["wall"], "close": t["close"], "wall": t["wall"] / u_wall,
                    "wall_close": (t["wall"] + t["start"] + t["close"]) / u_wall, "cpu": t["cpu"] / u_cpu,
                    "cpu_close": (t["cpu"] + t["cpu_close"]) / u_cpu, "first": k == 0})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="child processes")
    ap.add_argument("--reps", type=int, default=3, help="traced/untraced alternations per process")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch/OpenMP threads of the engine; 0 = vLLM's own binding (2 here). Default 1: on a "
                         "shared 2-core box, vLLM's OpenMP threads spin against other processes and every small "
                         "torch op then costs milliseconds, which swamps what is being measured")
    ap.add_argument("--profile", action="store_true", help="also isolate hook / clone / write costs")
    ap.add_argument("--trace-positions", default=None, metavar="RANGES",
                    help='trace only these token positions (the spec option, e.g. "120-")')
    ap.add_argument("--keep", type=Path, help="keep the traces under this directory")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return

    from transformers import AutoTokenizer

    from ekka_core.zoo import build_model

    model = str(build_model("llama", overrides=OVERRIDES))
    ids = AutoTokenizer.from_pretrained(model)(TEXT)["input_ids"][: a.prompt_tokens]
    if len(ids) < a.prompt_tokens:
        raise SystemExit(f"the text only has {len(ids)} tokens")
    root = a.keep or Path(tempfile.mkdtemp(prefix="ekka-overhead-"))
    print(f"model {model} (llama, {OVERRIDES}), bf16, prompt {len(ids)} tokens, "
          f"max_new_tokens {a.max_new_tokens}, {a.runs} process(es) x {a.reps} alternations"
          + (f", trace positions {a.trace_positions!r}" if a.trace_positions else ""), flush=True)

    def cfg(variant: str, k: int) -> dict:
        return {"variant": variant, "model": model, "prompt_ids": ids, "max_new_tokens": a.max_new_tokens,
                "out_dir": str(root / f"{variant}-{k}"), "reps": a.reps, "threads": a.threads,
                "options": {"positions": a.trace_positions or ""}}

    try:
        report(a, cfg, root)
    finally:
        if not a.keep:
            import shutil
            shutil.rmtree(root, ignore_errors=True)


def report(a: argparse.Namespace, cfg, root: Path) -> None:  # noqa: ANN001
    results, rows = [], []
    for k in range(a.runs):
        r = run_child(cfg("full", k))
        results.append(r)
        for j, x in enumerate(ratios(r)):
            rows.append(x)
            print(f"  process {k} rep {j}: untraced {x['u']:.3f} s  traced {x['t']:.3f} s (+close {x['close']:.3f} s)"
                  f"  wall {x['wall']:.2f}x (incl. start/close {x['wall_close']:.2f}x)  CPU-time {x['cpu']:.2f}x",
                  flush=True)
        print(f"  process {k}: peak RSS untraced generate {r['rss_untraced_mib']:.0f} MiB, traced phase "
              f"{r['rss_traced_mib']:.0f} MiB (engine built {r['rss_engine_mib']:.0f} MiB, whole process "
              f"ru_maxrss {r['rss_process_mib']:.0f} MiB)", flush=True)

    med = statistics.median
    t0 = results[0]["traced"][0]
    print()
    print(f"calls traced {t0['calls']}, forward steps {t0['steps']}, tokens processed {t0['tokens']} "
          f"(prompt + fed-back generated tokens), torch threads {results[0]['torch_threads']}, "
          f"{len(rows)} traced/untraced pairs")
    print(f"untraced generate (median)           {med([x['u'] for x in rows]):.3f} s")
    print(f"traced generate (median)             {med([x['t'] for x in rows]):.3f} s   "
          f"(+ close rpc {med([x['close'] for x in rows]):.3f} s: last shard + index.json)")
    print(f"RATIO traced/untraced, wall          {med([x['wall'] for x in rows]):.2f}x   (generate only)")
    print(f"ratio incl. start + close rpc, wall  {med([x['wall_close'] for x in rows]):.2f}x")
    print(f"ratio, process CPU time              {med([x['cpu'] for x in rows]):.2f}x   "
          f"(incl. close {med([x['cpu_close'] for x in rows]):.2f}x; less sensitive to other load)")
    later = [x["wall"] for x in rows if not x["first"]]
    if later:
        print(f"  first traced run in a process      {med([x['wall'] for x in rows if x['first']]):.2f}x   "
              f"later ones {med(later):.2f}x  (the first also pays reading the source files)")
    per_tok = [t["shard_bytes"] / t["tokens"] for r in results for t in r["traced"]]
    print(f"trace bytes per token                {med(per_tok) / 1024:.0f} KiB   "
          f"({t0['shard_bytes'] / 2**20:.1f} MiB in {t0['shards']} shard(s) for {t0['tokens']} tokens; "
          f"index.json {t0['index_bytes'] / 1024:.0f} KiB)")
    ru, rt = med([r["rss_untraced_mib"] for r in results]), med([r["rss_traced_mib"] for r in results])
    print(f"peak RSS untraced / traced           {ru:.0f} MiB / {rt:.0f} MiB  ({rt / ru:.2f}x; whole process "
          f"ru_maxrss {med([r['rss_process_mib'] for r in results]):.0f} MiB)")

    if a.profile:
        print("\nwhere the traced time goes (one process each; ratios against the same process' untraced runs):")
        for variant in ("hooks-only", "clone-only", "cprofile"):
            r = run_child(cfg(variant, 0))
            xs = ratios(r)
            print(f"  {variant:11s} traced {med([x['t'] for x in xs]):.3f} s vs untraced {med([x['u'] for x in xs]):.3f} s"
                  f"  -> wall {med([x['wall'] for x in xs]):.2f}x (incl. close {med([x['wall_close'] for x in xs]):.2f}x)"
                  f"  CPU-time {med([x['cpu'] for x in xs]):.2f}x   peak RSS {r['rss_untraced_mib']:.0f} -> "
                  f"{r['rss_traced_mib']:.0f} MiB", flush=True)
            if "categories" in r:
                total = r["categories"][-1][1]
                print(f"    own time by category, {len(xs)} traced generate+close runs under cProfile:")
                for c, t in r["categories"]:
                    print(f"      {c:48s} {t:7.3f} s  {100 * t / total:5.1f} %")
                print(r["profile"])


if __name__ == "__main__":
    main()
