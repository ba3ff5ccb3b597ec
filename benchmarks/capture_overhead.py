"""Capture overhead of tracing the vLLM target: traced / untraced generate time, trace bytes per token, peak RSS.

    .venv/bin/python benchmarks/capture_overhead.py [--runs 3] [--prompt-tokens 128] [--max-new-tokens 8]
                                                    [--profile] [--keep DIR]

Model: the zoo's llama made larger (hidden 1024, 8 layers, 16 heads, 4 KV heads, head_dim 64, intermediate 2816),
bf16, one prompt of exactly ``--prompt-tokens`` token ids (fed as ids, so its length is exact).

Each measurement is one fresh child process (VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_CPU_KVCACHE_SPACE=1, engine
built with ``ekka_core.capture.vllm_runner.engine_args``) that

  1. warms up with one untraced ``llm.generate``;
  2. times an untraced ``generate``                        (U1)  — then reads ru_maxrss: the untraced peak;
  3. starts tracing exactly as ``vllm_runner.run`` does (``collective_rpc("ekka_trace_control", ("start", …))``),
     times ``generate`` (T) and the ``close`` rpc (C: final shard + index written) separately;
  4. times one more untraced ``generate``                  (U2)  — then reads ru_maxrss: the traced peak.

ratio = T / mean(U1, U2) (untraced runs on both sides cancel drift from other load on the machine), and
ratio_incl_close = (T + C) / mean(U1, U2). Medians over ``--runs`` processes are printed.

``--profile`` adds three more child processes that isolate where the traced time goes, by monkeypatching
``TraceWriter`` in the child only (ekka_core itself is untouched):
  hooks-only   hooks fire and build the index, but ``add_tensor`` stores nothing (no clone, no write);
  clone-only   tensors are cloned to CPU as usual but the shards are never written to disk;
  cprofile     a full traced generate+close under cProfile; the top functions by own time are printed.
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
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: KiB


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


def child(cfg: dict) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    from dataclasses import asdict

    import vllm
    from vllm import LLM, SamplingParams

    from ekka_core.capture.trace import RunInfo
    from ekka_core.capture.vllm_runner import engine_args
    from ekka_core.spec import DiagnosisSpec

    variant = cfg["variant"]
    if variant in ("hooks-only", "clone-only"):
        _patch(variant)
    spec = DiagnosisSpec(model=cfg["model"], prompts=["(token ids)"], dtype="bfloat16",
                         max_new_tokens=cfg["max_new_tokens"])
    args = engine_args(spec)
    llm = LLM(**args)
    prompt = [{"prompt_token_ids": cfg["prompt_ids"]}]
    params = SamplingParams(temperature=0.0, max_tokens=cfg["max_new_tokens"], ignore_eos=True)

    def generate() -> tuple[float, list]:
        t0 = time.perf_counter()
        out = llm.generate(prompt, params, use_tqdm=False)
        return time.perf_counter() - t0, out

    generate()                                        # warm-up, untraced
    u1, _ = generate()
    rss_untraced = _maxrss_mib()

    out_dir = Path(cfg["out_dir"])
    info = RunInfo(framework="vllm", framework_version=vllm.__version__, role="target", model=spec.model,
                   dtype=spec.dtype, engine_args={k: v for k, v in args.items() if k != "model"},
                   prompts=list(spec.prompts))
    profiler = None
    if variant == "cprofile":
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    llm.collective_rpc("ekka_trace_control", args=("start", str(out_dir), asdict(info)))
    t_start = time.perf_counter() - t0
    traced, outputs = generate()
    prompt_ids = [list(o.prompt_token_ids) for o in outputs]
    generated = [list(o.outputs[0].token_ids) for o in outputs]
    token_ids = [p + g[:-1] for p, g in zip(prompt_ids, generated)]
    seq_by_req = {o.request_id: i for i, o in enumerate(outputs)}
    t0 = time.perf_counter()
    stats = llm.collective_rpc("ekka_trace_control", args=("close", seq_by_req, [len(p) for p in prompt_ids],
                                                           token_ids, generated, prompt_ids, None))
    t_close = time.perf_counter() - t0
    if profiler is not None:
        profiler.disable()
    u2, _ = generate()
    rss_traced = _maxrss_mib()

    shards = sorted(out_dir.glob("shard-*.safetensors"))
    result = {
        "variant": variant, "untraced_s": [u1, u2], "traced_s": traced, "start_s": t_start, "close_s": t_close,
        "rss_untraced_mib": rss_untraced, "rss_traced_mib": rss_traced,
        "tokens": sum(len(t) for t in token_ids), "shard_bytes": sum(p.stat().st_size for p in shards),
        "shards": len(shards), "index_bytes": (out_dir / "index.json").stat().st_size
        if (out_dir / "index.json").exists() else 0,
        "calls": stats[0]["calls"], "steps": stats[0]["steps"], "torch_threads": _threads(),
    }
    if profiler is not None:
        import io
        import pstats
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(18)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--profile", action="store_true", help="also isolate hook / clone / write costs")
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
          f"max_new_tokens {a.max_new_tokens}, {a.runs} process(es)", flush=True)

    def cfg(variant: str, k: int) -> dict:
        return {"variant": variant, "model": model, "prompt_ids": ids, "max_new_tokens": a.max_new_tokens,
                "out_dir": str(root / f"{variant}-{k}")}

    results = []
    for k in range(a.runs):
        r = run_child(cfg("full", k))
        results.append(r)
        u = statistics.mean(r["untraced_s"])
        print(f"  run {k}: untraced {r['untraced_s'][0]:.3f}/{r['untraced_s'][1]:.3f} s  traced {r['traced_s']:.3f} s"
              f" + close {r['close_s']:.3f} s  ratio {r['traced_s'] / u:.2f}x  (incl. close "
              f"{(r['traced_s'] + r['close_s']) / u:.2f}x)  RSS {r['rss_untraced_mib']:.0f} -> "
              f"{r['rss_traced_mib']:.0f} MiB", flush=True)

    def med(f):  # noqa: ANN001
        return statistics.median(f(r) for r in results)

    r0 = results[0]
    print()
    print(f"calls traced {r0['calls']}, forward steps {r0['steps']}, tokens processed {r0['tokens']}, "
          f"torch threads {r0['torch_threads']}")
    print(f"untraced generate (median)     {med(lambda r: statistics.mean(r['untraced_s'])):.3f} s")
    print(f"traced generate (median)       {med(lambda r: r['traced_s']):.3f} s  "
          f"(+ start rpc {med(lambda r: r['start_s']):.3f} s, close rpc {med(lambda r: r['close_s']):.3f} s)")
    print(f"ratio traced/untraced          {med(lambda r: r['traced_s'] / statistics.mean(r['untraced_s'])):.2f}x"
          f"   (generate only)")
    print(f"ratio incl. close              "
          f"{med(lambda r: (r['traced_s'] + r['close_s']) / statistics.mean(r['untraced_s'])):.2f}x"
          f"   (generate + writing the last shard and the index)")
    print(f"trace bytes per token          {med(lambda r: r['shard_bytes'] / r['tokens']) / 1024:.0f} KiB "
          f"({r0['shard_bytes'] / 2**20:.1f} MiB in {r0['shards']} shard(s); index.json "
          f"{r0['index_bytes'] / 1024:.0f} KiB)")
    print(f"peak RSS untraced / traced     {med(lambda r: r['rss_untraced_mib']):.0f} MiB / "
          f"{med(lambda r: r['rss_traced_mib']):.0f} MiB  "
          f"({med(lambda r: r['rss_traced_mib'] / r['rss_untraced_mib']):.2f}x)")

    if a.profile:
        print("\nwhere the traced time goes (one process each; ratios against the same process' untraced runs):")
        for variant in ("hooks-only", "clone-only", "cprofile"):
            r = run_child(cfg(variant, 0))
            u = statistics.mean(r["untraced_s"])
            print(f"  {variant:11s} traced {r['traced_s']:.3f} s + close {r['close_s']:.3f} s vs untraced {u:.3f} s"
                  f"  -> {r['traced_s'] / u:.2f}x ({(r['traced_s'] + r['close_s']) / u:.2f}x incl. close)"
                  f"  RSS {r['rss_untraced_mib']:.0f} -> {r['rss_traced_mib']:.0f} MiB")
            if "profile" in r:
                print(r["profile"])


if __name__ == "__main__":
    main()
