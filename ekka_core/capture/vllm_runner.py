"""Target runner for vLLM: greedy generation of all prompts as one batch, every module call traced.

Runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): hooks are installed on the worker's model through
``LLM.collective_rpc`` after the engine is built (so warm-up passes are not traced) and before generation.
Must run in its own process (the capture worker): vLLM owns torch's thread and memory settings there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ekka_core.capture.hooks import ModuleTracer
from ekka_core.capture.trace import RunInfo, TraceWriter
from ekka_core.errors import BadInput, InternalFailure
from ekka_core.spec import DiagnosisSpec

# The worker-side tracer; one per process (a TP worker is its own process).
_TRACER: ModuleTracer | None = None


def _engine_env() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


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
    args.update(user)
    return args


def declared_weight_mapping(model: Any) -> dict[str, Any]:
    """What vLLM itself says about loading HF checkpoints into this model class."""
    declared: dict[str, Any] = {"model_class": f"{type(model).__module__}.{type(model).__qualname__}"}
    packed = getattr(model, "packed_modules_mapping", None) or getattr(type(model), "packed_modules_mapping", None)
    declared["packed_modules_mapping"] = {k: list(v) for k, v in (packed or {}).items()}
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None:
        declared["hf_to_vllm_mapper"] = {a: {str(k): (str(v) if v is not None else None) for k, v in
                                              (getattr(mapper, a, None) or {}).items()}
                                         for a in ("orig_to_new_prefix", "orig_to_new_substr", "orig_to_new_suffix")}
    inner = getattr(model, "model", None)
    normalizer = getattr(inner, "normalizer", None)
    if normalizer is not None:
        declared["embedding_normalizer"] = float(normalizer)
    return declared


def _install(worker: Any, out_dir: str, run: dict[str, Any]) -> int:
    """Runs inside the vLLM worker: attach the tracer to the loaded model."""
    global _TRACER
    runner = worker.model_runner
    model = runner.get_model()

    def layout(args: tuple, kwargs: dict) -> tuple[list[Any], list[int]]:
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        pos = positions.tolist()
        batch = runner.input_batch
        n = batch.num_reqs
        starts = runner.query_start_loc.np[: n + 1].tolist()
        reqs: list[Any] = [None] * len(pos)  # rows past the last request are padding
        for i, rid in enumerate(batch.req_ids[:n]):
            for row in range(starts[i], starts[i + 1]):
                reqs[row] = rid
        return reqs, pos

    writer = TraceWriter(Path(out_dir), RunInfo(**run))
    writer.run.declared = declared_weight_mapping(model)
    _TRACER = ModuleTracer(writer, layout).attach(model)
    return len(_TRACER.handles)


def _close(worker: Any, seq_by_req: dict[str, int], prompt_lens: list[int], token_ids: list[list[int]],
           generated: list[list[int]], own_prompt_ids: list[list[int]], failure: str | None) -> dict[str, int]:
    global _TRACER
    tracer = _TRACER
    assert tracer is not None
    tracer.detach()

    def seq_of(rid: str) -> int:
        if rid in seq_by_req:
            return seq_by_req[rid]
        # the engine may suffix the external id ("0-3f2a…"): match on the external prefix
        for ext, s in seq_by_req.items():
            if rid.startswith(ext + "-"):
                return s
        raise InternalFailure(f"trace step mentions request {rid!r} that the batch did not contain")

    run = tracer.writer.run
    run.token_ids, run.prompt_lens, run.generated_ids = token_ids, prompt_lens, generated
    run.own_prompt_token_ids = own_prompt_ids
    if failure is None:
        tracer.resolve_steps(seq_of, prompt_lens)
    tracer.writer.close(complete=failure is None and tracer.fired > 0,
                        failure=failure or (None if tracer.fired else "no module hook fired"))
    _TRACER = None
    return {"calls": len(tracer.writer.calls), "steps": len(tracer.writer.steps), "fired": tracer.fired}


def run(spec: DiagnosisSpec, out_dir: Path) -> dict[str, Any]:
    _engine_env()
    import vllm
    from vllm import LLM, SamplingParams

    args = engine_args(spec)
    try:
        llm = LLM(**args)
    except Exception as e:  # vLLM reports unsupported architectures and bad configs as plain exceptions
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "not supported" in msg.lower() or "architecture" in msg.lower():
            raise BadInput(f"vLLM cannot load {spec.model}: {msg}",
                           fix="use an architecture this vLLM release supports") from e
        raise InternalFailure(f"vLLM failed to start: {msg}") from e

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
    llm.collective_rpc(_install, args=(str(out_dir), asdict(run_info)))
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
    stats = llm.collective_rpc(_close, args=(seq_by_req, [len(p) for p in prompt_ids], token_ids, generated,
                                             own_ids, failure))[0]
    if failure:
        raise InternalFailure(failure + f" (partial trace kept in {out_dir}, marked incomplete)")
    return stats
