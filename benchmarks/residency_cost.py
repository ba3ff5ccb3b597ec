"""What a checkpoint costs in memory while capture loads it and computes with it (``ekka_core/capture/residency.py``).

On the 1B-shaped Llama of issue 25 (2048 x 16 layers, fp32 checkpoint of 4 GB; one ~300-token prompt), each
measurement in a fresh child process, its peak RSS as the kernel counts it (``ru_maxrss``: the mapped checkpoint's
resident pages included):

* the reference's low-precision load (bf16 from the fp32 checkpoint: every tensor converted): mapped whole as
  Transformers does, with the checkpoint's pages let go every 0.1 s (:func:`letting_go_while_loading`, what Ekka
  does), and read by safetensors' ``pread`` backend (the alternative it was measured against);
* the fp32 reference (weights are zero-copy views of the mapped file) loaded and run forward over the prompt: as
  Transformers does, and as Ekka does (:func:`load_model`: each module's pages let go after its forward) — the
  logits compared bit for bit;
* an untraced vLLM engine run (the traced baseline's arguments, a fresh process, not the warm run host) with and
  without Ekka's plugin letting go while it loads (``EKKA_LET_GO_WHILE_LOADING``).

Not a test: it prints figures. ``--reps N`` alternates the variants N times.

    .venv/bin/python benchmarks/residency_cost.py [--reps 1] [--skip-engine]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ONE_B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 2048}
LOADS = ("bf16 load, mapped whole", "bf16 load, letting go", "bf16 load, pread")
FORWARDS = ("fp32 forward, pages kept", "fp32 forward, let go after each module")
ENGINES = ("engine run, vLLM's load", "engine run, letting go while loading")


def _prompt() -> str:
    from ekka_core import bugs
    return " ".join([bugs.DEFAULT_PROMPTS[0]] * 9)


def _model() -> tuple[str, list[int]]:
    from ekka_core.zoo import build_model
    from transformers import AutoTokenizer

    path = build_model("llama", overrides=ONE_B)
    return str(path), AutoTokenizer.from_pretrained(path)(_prompt())["input_ids"]


def _pread(modeling):  # noqa: ANN001, ANN202 - Transformers' module; returns the restore function
    """Transformers' checkpoint reads by ``pread`` (safetensors' ``backend="pread"``) rather than a mapping."""
    original = modeling.safe_open

    def safe_open(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if kwargs.get("backend", "mmap") == "mmap":
            kwargs["backend"] = "pread"
        return original(*args, **kwargs)

    modeling.safe_open = safe_open


def child(variant: str, path: str, ids: list[int]) -> dict:
    import torch
    import transformers.modeling_utils as modeling
    from transformers import AutoModelForCausalLM

    from ekka_core.capture.hf_runner import ATTN_IMPLEMENTATION, load_model
    from ekka_core.capture.residency import letting_go_while_loading

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    out: dict = {}
    if variant in LOADS:
        if variant == "bf16 load, pread":
            _pread(modeling)
        scope = letting_go_while_loading(path) if variant == "bf16 load, letting go" else contextlib.nullcontext()
        with scope:
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation=ATTN_IMPLEMENTATION)
    elif variant in FORWARDS:
        if variant == "fp32 forward, pages kept":
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                         attn_implementation=ATTN_IMPLEMENTATION).eval()
        else:
            model = load_model(path, torch.float32)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits
        out["logits_sum"] = float(logits.double().sum())       # the same logits either way, or this differs
    else:
        from ekka_core.capture import run_engine
        from ekka_core.capture.vllm_config import configuration, served_args
        from ekka_core.capture.vllm_plugin import LET_GO_WHILE_LOADING_ENV
        from ekka_core.contracts.spec import DiagnosisSpec

        spec = DiagnosisSpec(model=path, prompts=[_prompt()], dtype="bfloat16", max_new_tokens=4)
        args, _ = configuration(served_args(spec)[0], None)
        os.environ["EKKA_RUN_HOST"] = "0"          # the engine in a child of this process, waited for by it
        env = {LET_GO_WHILE_LOADING_ENV: "0.1"} if "letting go" in variant else {}
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            run = run_engine(spec, Path(d), args, label="engine", score=False, fresh=True, env=env)
        out["generated"] = [r.generated for r in run.outputs.requests]
        # the engine ran in a child of this process (no run host): its peak is the children's
        out["peak_gb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    out["seconds"] = round(time.perf_counter() - t0, 2)
    out.setdefault("peak_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1, help="alternations of the variants")
    ap.add_argument("--skip-engine", action="store_true", help="the HF parts only (no vLLM engine runs)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        cfg = json.loads(a.child)
        print("RESULT " + json.dumps(child(cfg["variant"], cfg["path"], cfg["ids"])))
        return 0
    path, ids = _model()
    print(f"model {path} (1B-shaped Llama, fp32 checkpoint), prompt {len(ids)} tokens, {a.reps} alternation(s)")
    variants = [*LOADS, *FORWARDS, *([] if a.skip_engine else ENGINES)]
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for rep in range(a.reps):
        for v in variants:
            proc = subprocess.run([sys.executable, __file__, "--child", json.dumps({"variant": v, "path": path,
                                                                                    "ids": ids})],
                                  capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                print(f"{v}: failed (exit {proc.returncode})\n{proc.stderr[-2000:]}")
                return 1
            r = json.loads(line[len("RESULT "):])
            results[v].append(r)
            print(f"  rep {rep} {v}: {r['seconds']} s, peak RSS {r['peak_gb']:.2f} GB")
    print("\n| variant | s (median) | peak RSS GB (median) |\n|---|---|---|")
    for v, rs in results.items():
        print(f"| {v} | {statistics.median(r['seconds'] for r in rs):.1f} | "
              f"{statistics.median(r['peak_gb'] for r in rs):.2f} |")
    same = {v: {json.dumps({k: r[k] for k in ('logits_sum', 'generated') if k in r}) for r in results[v]}
            for v in variants}
    if not a.skip_engine:
        print(f"engine outputs the same with and without letting go: {same[ENGINES[0]] == same[ENGINES[1]]}")
    print(f"fp32 logits the same with and without letting go: {same[FORWARDS[0]] == same[FORWARDS[1]]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
