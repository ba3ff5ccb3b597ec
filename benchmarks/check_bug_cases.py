"""On-demand check that benchmark bug cases (ekka_core.bugs) really show their bug — in real vLLM, without Ekka.

For each case: build its zoo model, start vLLM in-process with ``EKKA_INJECT_BUG`` set (one engine configuration
per subprocess, so injections and settings never leak), send the case's requests in waves (a request with
``after`` is sent once that request has finished; requests with the same ``after`` go together in one
``LLM.generate``/``LLM.chat`` call), and compare the engine's sampled top-k logprobs with HF Transformers
teacher-forced on the same tokens (``attn_implementation="eager"``, fp32 and the case's dtype):

    d32   = max |logprob_engine − logprob_HF_fp32|           over every generated position and top-k token
    noise = max |logprob_HF_lowprec − logprob_HF_fp32|       same positions and tokens: the reference's own error
    ratio = d32 / max(noise, 1e-3)                          ≈1 correct, ≫1 a bug (logits-level error ratio)
    dlow  = max |logprob_engine − logprob_HF_lowprec|

Configurations: ``served`` (the case's engine_args over vLLM's defaults), ``baseline`` (what Ekka traces: eager,
compilation mode 0, no prefix cache, whole prompts in one chunk, one request at a time); for cases that name a
culprit (family B) also ``baseline+<factor>`` and ``served`` without the injection (``served-clean``), which must
match HF. A family-A case must show in the baseline too; ``chat-double-bos`` compares prompt token ids with HF's
``apply_chat_template``. Rounding-convention cases (expected words "closer to fp32") sit below logits-level noise
in a 4-layer model (their engine is *closer* to fp32 than the reference): they are checked at the module they
break (``PROBES``, a forward hook in both frameworks, first request's prompt) against the clean baseline — the
injected engine must depart from HF's low-precision rounding where the clean one matches it bit for bit, and be
closer to fp32 than HF is. ``--clean-baseline`` adds the uninjected baseline to every case.

Injected runs never share vLLM's torch.compile cache with another run (ekka_core.bugs gives each injection a cache root
of its own).

    .venv/bin/python benchmarks/check_bug_cases.py                       # every case this script knows
    .venv/bin/python benchmarks/check_bug_cases.py --cases chat-double-bos,rmsnorm-weight-in-fp32
    .venv/bin/python benchmarks/check_bug_cases.py --json /tmp/checks.json

Slow (compiled engine starts take 20–60 s on two cores); not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOP_K = 5
NOISE_FLOOR = 1e-3
DIVERGES = 3.0          # ratio above which a configuration "diverges clearly"
CLEAN = 2.0             # ratio below which it is clean
DEFAULT_CASES = [
    "chat-double-bos", "granite-embedding-multiplier-skipped", "rmsnorm-weight-in-fp32", "gemma-normalizer-fp32",
    "vaultgemma-long-prompt", "prefix-cache-hit-corrupts-resumed-prefill", "chunked-prefill-context-dropped",
    "compiled-default-rotary-native", "batch-composition-decode-offset",
]
# Rounding-convention cases sit below logits-level noise in a 4-layer model: they are checked at the module they
# break, on the first request's prompt tokens — the module's output, or its input (what reaches it).
PROBES = {
    "rmsnorm-weight-in-fp32": {"module": "model.layers.0.input_layernorm", "side": "output"},
    "gemma-normalizer-fp32": {"module": "model.layers.0", "side": "input"},
}
BASELINE = {"enforce_eager": True, "compilation_config": {"mode": 0}, "enable_prefix_caching": False,
            "max_num_batched_tokens": 2048, "max_num_seqs": 1}
FACTOR_ARGS = {"compilation": ("enforce_eager", "compilation_config"), "custom_ops": ("compilation_config",),
               "prefix_caching": ("enable_prefix_caching",), "chunked_prefill": ("max_num_batched_tokens",),
               "batching": ("max_num_seqs",)}


# ------------------------------------------------------------------------------------------- engine (subprocess)

def _waves(requests: list[dict[str, Any]]) -> list[list[int]]:
    """Request indices grouped into send waves: a request goes once the request it names in ``after`` finished."""
    done: set[str] = set()
    left = list(range(len(requests)))
    waves = []
    while left:
        ready = [i for i in left if requests[i].get("after") in (None, *done)]
        if not ready:
            raise SystemExit(f"requests wait for unknown ids: {[requests[i].get('after') for i in left]}")
        # requests with the same `after` go together; earlier-listed groups first
        group = [i for i in ready if requests[i].get("after") == requests[ready[0]].get("after")]
        waves.append(group)
        done.update(requests[i].get("id") or f"#{i}" for i in group)
        left = [i for i in left if i not in group]
    return waves


def _probe_tensor(side: str, args: tuple, kwargs: dict, output: Any) -> Any:
    import torch

    if side == "output":
        t = output[0] if isinstance(output, tuple) else output
    else:
        t = kwargs.get("hidden_states")
        if t is None:
            t = next(a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() >= 2)
    return t.detach().to(torch.float32).reshape(-1, t.shape[-1]).clone()


_PROBED: list[Any] = []


def _install_probe(model: Any, probe: dict[str, Any]) -> None:
    module = model.get_submodule(probe["module"])

    def hook(mod: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if not _PROBED:
            _PROBED.append(_probe_tensor(probe["side"], args, kwargs, output))

    module.register_forward_hook(hook, with_kwargs=True)


def engine_worker(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if job.get("bug"):
        os.environ["EKKA_INJECT_BUG"] = job["bug"]
    else:
        os.environ.pop("EKKA_INJECT_BUG", None)
    t0 = time.time()
    from vllm import LLM, SamplingParams

    llm = LLM(model=job["model"], dtype=job["dtype"], seed=0, **job["engine_args"])
    start = time.time() - t0
    cfg = llm.llm_engine.vllm_config
    cc, sc, cache = cfg.compilation_config, cfg.scheduler_config, cfg.cache_config
    resolved = {"compilation_mode": str(getattr(cc, "mode", "?")), "custom_ops": list(getattr(cc, "custom_ops", [])),
                "enabled_custom_ops": sorted(getattr(cc, "enabled_custom_ops", []) or []),
                "disabled_custom_ops": sorted(getattr(cc, "disabled_custom_ops", []) or []),
                "prefix_caching": bool(cache.enable_prefix_caching), "block_size": cache.block_size,
                "chunked_prefill": bool(getattr(sc, "enable_chunked_prefill", getattr(sc, "chunked_prefill_enabled",
                                                                                          None))),
                "max_num_batched_tokens": sc.max_num_batched_tokens, "max_num_seqs": sc.max_num_seqs,
                "max_model_len": cfg.model_config.max_model_len}
    if job.get("probe"):
        llm.apply_model(lambda model: _install_probe(model, job["probe"]))
    requests = job["requests"]
    results: list[dict[str, Any] | None] = [None] * len(requests)
    for w, wave in enumerate(_waves(requests)):
        params = [SamplingParams(temperature=0.0, max_tokens=requests[i]["max_new_tokens"], logprobs=TOP_K,
                                 ignore_eos=True, seed=0) for i in wave]
        chats = [i for i in wave if requests[i].get("messages") is not None]
        if chats and len(chats) != len(wave):
            raise SystemExit("a wave mixes chat and plain requests; give them different `after`")
        if chats:
            outs = llm.chat([requests[i]["messages"] for i in wave], params, use_tqdm=False)
        else:
            prompts = [requests[i]["prompt"] if requests[i].get("prompt") is not None
                       else {"prompt_token_ids": requests[i]["prompt_token_ids"]} for i in wave]
            outs = llm.generate(prompts, params, use_tqdm=False)
        for i, o in zip(wave, outs):
            c = o.outputs[0]
            results[i] = {"prompt_token_ids": list(o.prompt_token_ids), "generated": list(c.token_ids),
                          "logprobs": [{str(t): float(lp.logprob) for t, lp in step.items()} for step in c.logprobs],
                          "num_cached_tokens": int(o.num_cached_tokens or 0), "wave": w}
    if job.get("probe"):
        import numpy as np

        np.save(job["out"] + ".probe.npy", _PROBED[0].numpy() if _PROBED else np.zeros((0, 0), np.float32))
    Path(job["out"]).write_text(json.dumps({"resolved": resolved, "requests": results, "start_s": start,
                                            "total_s": time.time() - t0}))


# ------------------------------------------------------------------------------------------------- driver

def _case_requests(bug: Any) -> list[dict[str, Any]]:
    n = bug.max_new_tokens or 8
    if bug.requests:
        reqs = [dict(r) for r in bug.requests]
    elif bug.messages:
        reqs = [{"id": "chat", "messages": bug.messages}]
    else:
        reqs = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(bug.prompts)]
    for i, r in enumerate(reqs):
        r.setdefault("id", f"#{i}")
        r["max_new_tokens"] = r.get("max_new_tokens") or n
    return reqs


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def plan(bug: Any, clean_baseline: bool = False) -> list[tuple[str, dict[str, Any], bool]]:
    """(label, engine_args, inject) for every configuration the case needs."""
    served = dict(bug.engine_args)
    non_factor = {k: v for k, v in served.items() if not any(k in a for a in FACTOR_ARGS.values())}
    baseline = _merge(BASELINE, non_factor)
    runs = [("served", served, True), ("baseline", baseline, True)]
    for factor in bug.expected_culprit or []:
        if factor == "custom_ops":
            trial = _merge(baseline, {"compilation_config": {"custom_ops": ["none"]}})
        elif factor == "prefix_caching":
            trial = _merge(baseline, {"enable_prefix_caching": True})
        elif factor == "chunked_prefill":
            trial = _merge(baseline, {"max_num_batched_tokens": served.get("max_num_batched_tokens", 2048)})
        elif factor == "batching":
            trial = {k: v for k, v in baseline.items() if k != "max_num_seqs"}
            if "max_num_seqs" in served:
                trial["max_num_seqs"] = served["max_num_seqs"]
        else:  # compilation
            trial = {k: v for k, v in baseline.items() if k not in ("enforce_eager", "compilation_config")}
        runs.append((f"baseline+{factor}", trial, True))
    if bug.expected_culprit:
        runs.append(("served-clean", served, False))
    if "closer to fp32" in (bug.expected_words or "") or clean_baseline:
        runs.append(("baseline-clean", baseline, False))
    return runs


def run_engine(model: Path, dtype: str, args: dict[str, Any], requests: list[dict[str, Any]], bug: str | None,
               log_dir: Path, label: str, timeout: int, probe: dict[str, Any] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        job = {"model": str(model), "dtype": dtype, "engine_args": args, "requests": requests, "bug": bug,
               "out": str(Path(tmp) / "out.json"), "probe": probe}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        log = log_dir / f"{label}.log"
        env = dict(os.environ)
        env.pop("EKKA_INJECT_BUG", None)
        t0 = time.time()
        with log.open("w") as fh:
            rc = subprocess.run([sys.executable, __file__, "--engine-worker", str(Path(tmp) / "job.json")],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=REPO).returncode
        if rc != 0:
            tail = log.read_text()[-3000:]
            return {"error": f"engine exited {rc} after {time.time() - t0:.0f}s; log {log}:\n{tail}"}
        out = json.loads((Path(tmp) / "out.json").read_text())
        if probe:
            import numpy as np

            out["probe"] = np.load(str(Path(tmp) / "out.json") + ".probe.npy")
        return out


class Reference:
    """HF teacher-forced log-probabilities (eager attention) for token sequences, fp32 and the low precision."""

    def __init__(self, model: Path, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.models = {name: AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, name),
                                                                  attn_implementation="eager").eval()
                       for name in dict.fromkeys(["float32", dtype])}
        self.dtype = dtype
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self._cache: dict[tuple[str, tuple[int, ...]], Any] = {}

    def logprobs(self, name: str, tokens: list[int]) -> Any:
        key = (name, tuple(tokens))
        if key not in self._cache:
            with self.torch.no_grad():
                logits = self.models[name](input_ids=self.torch.tensor([tokens])).logits[0]
            self._cache[key] = self.torch.log_softmax(logits.float(), dim=-1)
        return self._cache[key]

    def probe(self, name: str, tokens: list[int], probe: dict[str, Any]) -> Any:
        got: list[Any] = []
        module = self.models[name].get_submodule(probe["module"])
        handle = module.register_forward_hook(
            lambda mod, args, kwargs, output: got.append(_probe_tensor(probe["side"], args, kwargs, output)),
            with_kwargs=True)
        try:
            with self.torch.no_grad():
                self.models[name](input_ids=self.torch.tensor([tokens]))
        finally:
            handle.remove()
        return got[0].numpy()

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)


def compare(ref: Reference, outcome: dict[str, Any], requests: list[dict[str, Any]]) -> dict[str, Any]:
    d32 = dlow = noise = 0.0
    mismatched_tokens = 0
    per_request = []
    inputs_differ = []
    for i, (req, res) in enumerate(zip(requests, outcome["requests"])):
        prompt, gen = res["prompt_token_ids"], res["generated"]
        if req.get("messages") is not None:
            hf_ids = ref.chat_ids(req["messages"])
            if hf_ids != prompt:
                inputs_differ.append({"request": req["id"], "engine": prompt[:6], "hf": hf_ids[:6],
                                      "engine_len": len(prompt), "hf_len": len(hf_ids)})
        tokens = prompt + gen[:-1]
        f32 = ref.logprobs("float32", tokens)
        low = ref.logprobs(ref.dtype, tokens)
        r32 = rlow = rnoise = 0.0
        for j, step in enumerate(res["logprobs"]):
            pos = len(prompt) - 1 + j
            if int(f32[pos].argmax()) != gen[j]:
                mismatched_tokens += 1
            for t, lp in step.items():
                t = int(t)
                a, b = float(f32[pos, t]), float(low[pos, t])
                r32, rlow, rnoise = max(r32, abs(lp - a)), max(rlow, abs(lp - b)), max(rnoise, abs(b - a))
        per_request.append({"id": req["id"], "d32": r32, "noise": rnoise, "cached": res["num_cached_tokens"],
                            "prompt_len": len(prompt), "wave": res["wave"]})
        d32, dlow, noise = max(d32, r32), max(dlow, rlow), max(noise, rnoise)
    n_tokens = sum(len(r["generated"]) for r in outcome["requests"])
    return {"d32": d32, "dlow": dlow, "noise": noise, "ratio": d32 / max(noise, NOISE_FLOOR),
            "tokens_off_fp32_argmax": f"{mismatched_tokens}/{n_tokens}", "per_request": per_request,
            "inputs_differ": inputs_differ}


def compare_probe(ref: Reference, outcome: dict[str, Any], probe: dict[str, Any]) -> dict[str, Any]:
    """The probed module on the first request's prompt: how far the engine is from the reference's own rounding
    (fraction of elements that differ, max |Δ|) and from fp32, relative to the reference's distance from fp32."""
    import numpy as np

    prompt = outcome["requests"][0]["prompt_token_ids"]
    e = outcome["probe"]
    f = ref.probe("float32", prompt, probe)[: len(e)]
    low = ref.probe(ref.dtype, prompt, probe)[: len(e)]
    err = lambda a: float(np.linalg.norm(a - f) / max(np.linalg.norm(f), 1e-30))
    return {"module": probe["module"], "side": probe["side"], "rows": int(len(e)),
            "frac_differs_from_ref": float(np.mean(e != low)), "max_abs_vs_ref": float(np.max(np.abs(e - low))),
            "rel_err_engine_vs_fp32": err(e), "rel_err_ref_vs_fp32": err(low),
            "module_ratio": err(e) / max(err(low), 1e-30)}


def judge(bug: Any, rows: dict[str, dict[str, Any]]) -> tuple[bool, str]:
    def ratio(label: str) -> float | None:
        r = rows.get(label, {})
        return None if "error" in r else r.get("ratio")

    def shows(label: str) -> bool:
        r = rows.get(label, {})
        if "error" in r:
            return False
        if bug.expected_verdict == "inputs-differ":
            return bool(r["inputs_differ"])
        if "closer to fp32" in (bug.expected_words or ""):
            # departs from the reference's rounding (where a clean engine does not) and is closer to fp32 than it
            clean = rows.get("baseline-clean", {}).get("probe")
            p = r.get("probe")
            return bool(p and clean and p["frac_differs_from_ref"] > max(10 * clean["frac_differs_from_ref"], 0.01)
                        and p["module_ratio"] < 1.0)
        return (ratio(label) or 0.0) >= DIVERGES

    notes = []
    ok = shows("served")
    notes.append(f"served {'shows' if ok else 'does NOT show'} the bug")
    if bug.expected_culprit:
        base_clean = (ratio("baseline") or 99.0) < CLEAN
        ok &= base_clean
        notes.append(f"baseline {'clean' if base_clean else 'NOT clean'}")
        for factor in bug.expected_culprit:
            t = shows(f"baseline+{factor}")
            ok &= t
            notes.append(f"baseline+{factor} {'diverges' if t else 'does NOT diverge'}")
        clean = (ratio("served-clean") or 99.0) < CLEAN
        ok &= clean
        notes.append(f"served without the bug {'matches HF' if clean else 'does NOT match HF'}")
    else:
        b = shows("baseline")
        ok &= b
        notes.append(f"baseline {'shows' if b else 'does NOT show'} it")
    return ok, "; ".join(notes)


def check_case(name: str, zoo_root: Path, log_root: Path, timeout: int, only: set[str] | None = None,
               clean_baseline: bool = False) -> dict[str, Any]:
    from ekka_core import bugs
    from ekka_core.zoo import build_model

    bug = bugs.get(name)
    model = build_model(bug.arch, overrides=bug.zoo_overrides or None, root=zoo_root)
    requests = _case_requests(bug)
    log_dir = log_root / name
    log_dir.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, Any]] = {}
    ref = None
    for label, args, inject in plan(bug, clean_baseline):
        if only and label not in only:
            continue
        t0 = time.time()
        probe = PROBES.get(name)
        out = run_engine(model, bug.dtype, args, requests, name if inject else None, log_dir, label, timeout, probe)
        if "error" in out:
            rows[label] = {"error": out["error"], "args": args}
            print(f"  {label:<26} ERROR {out['error'][:2000]}", flush=True)
            continue
        ref = ref or Reference(model, bug.dtype)
        row = compare(ref, out, requests)
        row.update(args=args, inject=inject, resolved=out["resolved"], start_s=out["start_s"],
                   wall_s=time.time() - t0)
        if probe:
            row["probe"] = compare_probe(ref, out, probe)
            out.pop("probe")
        rows[label] = row
        cached = ",".join(str(r["cached"]) for r in row["per_request"])
        extra = f" inputs-differ {row['inputs_differ']}" if row["inputs_differ"] else ""
        if probe:
            p = row["probe"]
            extra += (f"\n  {'':<26} {p['module']} {p['side']}: differs from HF-{bug.dtype} in "
                      f"{100 * p['frac_differs_from_ref']:.1f}% of elements (max {p['max_abs_vs_ref']:.2g}); rel. err. "
                      f"vs fp32 engine {p['rel_err_engine_vs_fp32']:.3g} / HF {p['rel_err_ref_vs_fp32']:.3g} "
                      f"= {p['module_ratio']:.2f}")
        print(f"  {label:<26} d32 {row['d32']:8.4f}  noise {row['noise']:7.4f}  ratio {row['ratio']:8.2f}  "
              f"dlow {row['dlow']:7.4f}  off-argmax {row['tokens_off_fp32_argmax']:>6}  cached [{cached}]  "
              f"start {out['start_s']:5.1f}s{extra}", flush=True)
    ok, words = judge(bug, rows)
    return {"case": name, "arch": bug.arch, "valid": ok, "verdict": words, "runs": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-worker", help=argparse.SUPPRESS)
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated bug names")
    ap.add_argument("--zoo-root", default="/tmp/zoo-bugs")
    ap.add_argument("--logs", default="/tmp/ekka-check-bug-cases")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per engine run")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--runs", help="only these configurations (e.g. baseline,baseline+prefix_caching)")
    ap.add_argument("--clean-baseline", action="store_true",
                    help="also run every case's baseline without the injection (must match HF)")
    a = ap.parse_args()
    if a.engine_worker:
        engine_worker(a.engine_worker)
        return 0
    results = []
    for name in [c for c in a.cases.split(",") if c]:
        print(f"{name}:", flush=True)
        res = check_case(name, Path(a.zoo_root), Path(a.logs), a.timeout,
                         set(a.runs.split(",")) if a.runs else None, a.clean_baseline)
        print(f"  => {'VALID' if res['valid'] else 'INVALID'}: {res['verdict']}", flush=True)
        results.append(res)
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    print("\ncase                                           valid  verdict")
    for r in results:
        print(f"{r['case']:<46} {'yes' if r['valid'] else 'NO':<6} {r['verdict']}")
    return 0 if all(r["valid"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
