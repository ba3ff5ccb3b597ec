"""Target runner for vLLM: greedy generation of all prompts as one batch, every module call traced.

With one rank the engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0); with tensor parallelism its workers
are processes of their own. Either way hooks are installed in every worker by Ekka's vLLM plugin, through
``LLM.collective_rpc("ekka_trace_control", …)`` after the engine is built (so warm-up passes are not traced) and
before generation. Must run in its own process (the capture worker): vLLM owns torch's threads there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ekka_core.capture.trace import RunInfo
from ekka_core.contracts.errors import BadInput, InternalFailure, engine_start_error
from ekka_core.contracts.spec import DiagnosisSpec


def engine_args(spec: DiagnosisSpec) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": spec.model, "dtype": spec.dtype, "seed": 0,
        # Hooks do not fire under CUDA-graph replay or inside a torch.compile'd graph: trace eagerly.
        "enforce_eager": True, "compilation_config": {"mode": 0},
        # With prefix caching a repeated prefix is never recomputed, hence never traced.
        "enable_prefix_caching": False,
        "max_model_len": 512,
    }
    user = dict(spec.engine_args)
    if user.get("enforce_eager") is False:
        raise BadInput("engine_args.enforce_eager=false: CUDA graphs replay kernels without running module hooks",
                       fix="remove enforce_eager from the spec (Ekka traces with enforce_eager=True)")
    if user.get("enable_prefix_caching"):
        raise BadInput("engine_args.enable_prefix_caching=true: cached prefix positions are never recomputed",
                       fix="remove enable_prefix_caching from the spec")
    if int(user.get("tensor_parallel_size", 1)) > 1:
        args["distributed_executor_backend"] = "mp"
    args.update(user)
    return args


def _engine_env(args: dict[str, Any]) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tp = int(args.get("tensor_parallel_size", 1))
    if tp == 1:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    else:
        # CPU TP workers need explicit core binding, one group per rank ("Not enough allowed NUMA nodes").
        cores = os.cpu_count() or tp
        per = max(cores // tp, 1)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            f"{r * per}-{r * per + per - 1}" if per > 1 else str(r * per) for r in range(tp)))


def run(spec: DiagnosisSpec, out_dir: Path) -> dict[str, Any]:
    args = engine_args(spec)
    _engine_env(args)
    import vllm
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(**args)
    except Exception as e:
        raise engine_start_error("vLLM", spec.model, e) from e

    tokenizer = llm.get_tokenizer()
    own_ids = [list(tokenizer.encode(p)) for p in spec.prompts]
    max_len = args["max_model_len"]
    for i, ids in enumerate(own_ids):
        if len(ids) + spec.max_new_tokens > max_len:
            raise BadInput(f"prompt {i} is {len(ids)} tokens; with {spec.max_new_tokens} new tokens it exceeds "
                           f"max_model_len={max_len}", fix="shorten the prompt or raise engine_args.max_model_len")

    run_info = RunInfo(framework="vllm", framework_version=vllm.__version__, role="target", model=spec.model,
                       dtype=spec.dtype, engine_args={k: v for k, v in args.items() if k != "model"},
                       prompts=list(spec.prompts))
    from dataclasses import asdict
    # The worker method comes from Ekka's vLLM plugin, loaded by vLLM itself in every worker process.
    llm.collective_rpc("ekka_trace_control", args=("start", str(out_dir), asdict(run_info),
                                                          spec.trace_options()))
    params = SamplingParams(temperature=0.0, max_tokens=spec.max_new_tokens, ignore_eos=True)
    failure = None
    outputs = []
    try:
        outputs = llm.generate(list(spec.prompts), params, use_tqdm=False)
    except Exception as e:
        failure = f"vLLM crashed during generation: {type(e).__name__}: {e}"
    seq_by_req = {o.request_id: i for i, o in enumerate(outputs)}
    prompt_ids = [list(o.prompt_token_ids) for o in outputs] or own_ids
    generated = [list(o.outputs[0].token_ids) for o in outputs]
    # What the model was fed: the prompt and every generated token but the last (which is only sampled).
    token_ids = [p + g[:-1] for p, g in zip(prompt_ids, generated)]
    try:
        stats = llm.collective_rpc("ekka_trace_control", args=("close", seq_by_req, [len(p) for p in prompt_ids],
                                                               token_ids, generated, own_ids, failure))
    except Exception as e:  # a dead engine cannot close its workers' traces; they stay on disk, unindexed
        raise InternalFailure(f"{failure or 'vLLM failed'}; closing the traces failed too ({e})") from e
    if args.get("tensor_parallel_size", 1) > 1 and failure is None:
        from ekka_core.capture.unshard import unshard
        unshard([Path(out_dir) / f"rank-{r}" for r in range(args["tensor_parallel_size"])], Path(out_dir))
    if failure:
        raise InternalFailure(failure + f" (partial trace kept in {out_dir}, marked incomplete)")
    return {"ranks": stats}
