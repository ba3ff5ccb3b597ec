"""Target runner for SGLang: greedy generation of all prompts as one batch, every module call traced.

Runs in the capture run process (``python -m ekka_core.capture.run_process target …``, under a ``__main__`` guard as
SGLang's spawned scheduler processes require). It builds ``sglang.Engine`` with CUDA graphs, torch.compile, the
radix (prefix) cache and overlap scheduling off, with Ekka's scheduler-process entry
(:func:`ekka_core.capture.sglang_tracing.run_scheduler_process`) so each scheduler — one per tensor-parallel rank —
can be told to start and close tracing through ``Engine.collective_rpc``. The prompts are tokenized by SGLang's
own tokenizer and submitted as token ids in one ``generate`` call with request ids Ekka chose (``ekka-<i>``), so
every traced row maps back to its sequence. With tensor parallelism each rank writes ``rank-<k>/`` and the driver
unshards them (:mod:`ekka_core.capture.unshard`).

Refusals (exit 2, before anything heavy starts where possible): engine arguments that would hide module calls
from the hooks (CUDA graphs, torch.compile), skip positions (radix cache) or lay rows out in ways the trace cannot
describe (speculative decoding, data/pipeline parallelism); SGLang not importable; no CUDA device.

Verified on CPU against a fake ``sglang`` that follows 0.5.23's API (tests/capture/test_sglang_capture.py): the engine
arguments and refusals, the traced-engine class, the start/generate/close sequence and its JSON requests, output
ids by request id, tensor-parallel unsharding, failures kept as incomplete traces. Only on a CUDA machine
(scripts/gpu-check.sh): a real ``sglang.Engine`` doing all of that; details in :mod:`sglang_tracing`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ekka_core.capture.trace import RunInfo, Trace
from ekka_core.contracts.errors import BadInput, InternalFailure, engine_start_error
from ekka_core.contracts.spec import DiagnosisSpec

REQUEST_ID_PREFIX = "ekka-"

# What a traced engine needs, why, and the value Ekka sets (a spec's engine_args may not undo it).
_REQUIRED = {
    "disable_cuda_graph": (True, "CUDA graphs replay kernels without running module hooks"),
    "enable_torch_compile": (False, "a torch.compile'd model runs without module hooks"),
    "disable_radix_cache": (True, "with the radix (prefix) cache a shared prefix is never recomputed, so never "
                                  "traced"),
}


def _refusal(key: str, value: Any) -> str | None:
    """Why an engine argument cannot be used for a traced run (None: it can)."""
    if key in _REQUIRED:
        wanted, why = _REQUIRED[key]
        return None if bool(value) == wanted else why
    if key == "cuda_graph_config" and value:
        return "a cuda_graph_config can turn CUDA graphs back on; graph replays run without module hooks"
    if key in ("cuda_graph_backend_decode", "cuda_graph_backend_prefill") and value not in (None, "disabled"):
        return "CUDA graphs replay kernels without running module hooks"
    if key == "enable_piecewise_cuda_graph" and value:
        return "piecewise CUDA graphs replay kernels without running module hooks"
    if key in ("speculative_algorithm", "speculative_draft_model_path") and value:
        return "speculative decoding verifies several draft tokens per request in one pass; Ekka traces one " \
               "token per request per decode step"
    if (key in ("dp_size", "attn_dp_size") and int(value or 1) > 1) or (key == "enable_dp_attention" and value):
        return "data parallelism splits the prompts across engine replicas; Ekka traces one batch"
    if key == "pp_size" and int(value or 1) > 1:
        return "pipeline parallelism splits the layers across processes; Ekka traces whole models per rank"
    return None


def engine_args(spec: DiagnosisSpec) -> dict[str, Any]:
    """``sglang.Engine`` keyword arguments for a traced run of ``spec`` (BadInput for arguments it cannot trace)."""
    user = dict(spec.engine_args)
    for key, value in user.items():
        why = _refusal(key, value)
        if why:
            fixed = f" (Ekka sets {key}={_REQUIRED[key][0]})" if key in _REQUIRED else ""
            raise BadInput(f"engine_args.{key}={value!r}: {why}",
                           fix=f"remove {key} from the spec's engine_args{fixed}")
    args: dict[str, Any] = {
        "model_path": spec.model, "dtype": spec.declared_dtype(), "random_seed": 0,
        **{k: wanted for k, (wanted, _) in _REQUIRED.items()},
        # One forward at a time in the scheduler's thread: the traced steps are the engine's passes, in order.
        "disable_overlap_schedule": True,
        "log_level": "error",
    }
    args.update(user)
    return args


def import_sglang() -> Any:
    try:
        import sglang
    except ImportError as e:
        if e.name == "sglang":
            raise BadInput("SGLang is not installed in this environment (it ships CUDA-only wheels)",
                           fix="run on a CUDA machine with sglang installed (scripts/gpu-check.sh installs it), "
                               "or use --target vllm") from None
        raise BadInput(f"SGLang is installed but does not import: {e}",
                       fix="repair the SGLang installation on a CUDA machine (its CUDA libraries must load), "
                           "or use --target vllm") from None
    return sglang


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise BadInput("no CUDA device is visible: SGLang runs on NVIDIA GPUs only",
                       fix="run on a CUDA machine (check nvidia-smi and CUDA_VISIBLE_DEVICES), or use --target vllm")


def traced_engine_class(engine_cls: type) -> type:
    """``sglang.Engine`` whose scheduler processes can be traced: SGLang's documented override point for the
    scheduler process entry (``Engine.run_scheduler_process_func``), pointed at Ekka's wrapper."""
    from ekka_core.capture import sglang_tracing

    if not hasattr(engine_cls, "run_scheduler_process_func") or not hasattr(engine_cls, "collective_rpc"):
        raise BadInput("this SGLang release has no Engine.run_scheduler_process_func / collective_rpc, through "
                       "which Ekka traces the scheduler processes",
                       fix="use SGLang 0.5 or later (Ekka is written against 0.5.23)")

    class TracedEngine(engine_cls):  # type: ignore[misc, valid-type]
        run_scheduler_process_func = staticmethod(sglang_tracing.run_scheduler_process)

    return TracedEngine


def _control(engine: Any, **request: Any) -> None:
    from ekka_core.capture.sglang_tracing import CONTROL_METHOD

    try:
        engine.collective_rpc(CONTROL_METHOD, request=json.dumps(request))
    except AssertionError as e:   # SGLang reports a failed RPC as an assertion carrying the scheduler's message
        raise InternalFailure(f"Ekka's tracing ({request['cmd']}) failed in SGLang's scheduler: {e}") from e


def _start_engine(engine_cls: type, args: dict[str, Any], spec: DiagnosisSpec) -> Any:
    try:
        return engine_cls(**args)
    except Exception as e:
        raise engine_start_error("SGLang", spec.model, e) from e


def _generated_ids(outputs: Any, rids: list[str]) -> list[list[int]]:
    """Generated token ids per request, in ``rids`` order (SGLang answers a batch in order; the id confirms it)."""
    outputs = outputs if isinstance(outputs, list) else [outputs]
    by_id = {str(o.get("meta_info", {}).get("id")): o for o in outputs}
    ordered = [by_id.get(r) for r in rids] if all(r in by_id for r in rids) else outputs
    if len(ordered) != len(rids) or any(o is None or "output_ids" not in o for o in ordered):
        raise ValueError(f"SGLang answered {len(outputs)} outputs without output_ids for {len(rids)} requests")
    return [list(o["output_ids"]) for o in ordered]


def run(spec: DiagnosisSpec, out_dir: Path) -> dict[str, Any]:
    args = engine_args(spec)
    sglang = import_sglang()
    require_cuda()
    engine = _start_engine(traced_engine_class(sglang.Engine), args, spec)
    try:
        return _traced_generate(engine, sglang, args, spec, Path(out_dir))
    finally:
        engine.shutdown()


def _traced_generate(engine: Any, sglang: Any, args: dict[str, Any], spec: DiagnosisSpec, out_dir: Path
                     ) -> dict[str, Any]:
    manager = engine.tokenizer_manager
    requests = spec.request_list()
    if any(r.messages is not None for r in requests) or len(spec.waves()) > 1:
        raise BadInput("chat messages and request scenarios are supported on the vLLM target only",
                       fix="send prompt text or token ids, all together, to SGLang")
    own_ids = [list(manager.tokenizer.encode(r.prompt)) if r.prompt is not None else list(r.prompt_token_ids or [])
               for r in requests]
    context_len = getattr(manager, "context_len", None)
    for i, ids in enumerate(own_ids):
        if context_len and len(ids) + spec.max_new_tokens > context_len:
            raise BadInput(f"prompt {i} is {len(ids)} tokens; with {spec.max_new_tokens} new tokens it exceeds "
                           f"the model's context length {context_len}",
                           fix="shorten the prompt, lower --max-new-tokens or raise engine_args.context_length")
    rids = [f"{REQUEST_ID_PREFIX}{i}" for i in range(len(own_ids))]
    run_info = RunInfo(framework="sglang", framework_version=str(sglang.__version__), role="target",
                       model=spec.model, dtype=spec.declared_dtype(), prompts=spec.labels(),
                       engine_args={k: v for k, v in args.items() if k != "model_path"})
    seq_by_rid = {r: i for i, r in enumerate(rids)}
    prompt_lens = [len(p) for p in own_ids]
    _control(engine, cmd="start", out_dir=str(out_dir), run=asdict(run_info), options=spec.trace_options(),
             seq_by_rid=seq_by_rid, prompt_lens=prompt_lens)

    failure = None
    generated: list[list[int]] = []
    try:
        outputs = engine.generate(input_ids=own_ids, rid=rids, sampling_params={
            "temperature": 0.0, "max_new_tokens": spec.max_new_tokens, "ignore_eos": True})
        generated = _generated_ids(outputs, rids)
    except Exception as e:
        failure = f"SGLang failed during generation: {type(e).__name__}: {e}"
    # What the model was fed: the prompt and every generated token but the last (which is only sampled).
    token_ids = [p + g[:-1] for p, g in zip(own_ids, generated)] if generated else own_ids
    _control(engine, cmd="close", seq_by_rid=seq_by_rid, prompt_lens=prompt_lens, token_ids=token_ids,
             generated=generated, own_prompt_ids=own_ids, failure=failure)
    if failure:
        raise InternalFailure(f"{failure} (partial trace kept in {out_dir}, marked incomplete)")

    tp = int(args.get("tp_size", 1) or 1)
    if tp > 1:
        from ekka_core.capture.unshard import unshard
        unshard([out_dir / f"rank-{r}" for r in range(tp)], out_dir)
    trace = Trace(out_dir)
    if not trace.run.complete:
        raise InternalFailure(f"the SGLang trace failed Ekka's checks: {trace.run.failure} "
                              f"(kept in {out_dir}, marked incomplete)")
    return {"steps": len(trace.steps), "calls": len(trace.calls), "tp": tp}
