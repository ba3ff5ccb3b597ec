"""Target runner for vLLM: one engine configuration, the spec's requests sent as the user sends them, optionally
with every module call traced.

Requests go out in waves (:meth:`DiagnosisSpec.waves`): a wave is one ``LLM.generate`` call (prompt text and token
ids) or one ``LLM.chat`` call (conversations: the engine's own chat path renders them), so prefix-cache hits and
batching happen as in a server. Decoding is greedy unless a request says otherwise; every sampled position returns
its top-k logprobs, which the symptom check compares with the reference.

What the run records is what actually ran (:class:`~ekka_core.contracts.serving.EngineOutputs`): the ids the
engine's request path fed the model (``RequestOutput.prompt_token_ids``, checked against the rows the hooks saw when
tracing), the configuration the engine resolved from its arguments, how many prompt tokens came from the prefix
cache.

With one rank the engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0); with tensor parallelism its workers are
processes of their own. Hooks are installed in every worker by Ekka's vLLM plugin through
``LLM.collective_rpc("ekka_trace_control", …)`` after the engine is built (warm-up passes are not traced). Must run in
its own process (the capture worker): vLLM owns torch's threads there.
"""

from __future__ import annotations

import difflib
import os
import resource
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ekka_core.capture import vllm_compat
from ekka_core.capture.trace import RunInfo
from ekka_core.capture.vllm_plugin import WEIGHT_SUMS_ENV
from ekka_core.contracts.errors import BadInput, InternalFailure, engine_start_error
from ekka_core.contracts.serving import EngineOutputs, RequestOutcome
from ekka_core.contracts.spec import DiagnosisSpec, RequestSpec

# Top-k logprobs per sampled position (vLLM's default max_logprobs is 20).
SAMPLE_LOGPROBS = 20

# Token forcing (``run(forced=…)``): the logits processor vLLM imports by name in the engine, and the request's
# ``SamplingParams.extra_args`` key it reads the tokens from.
FORCED_PROCESSOR = "ekka_core.capture.vllm_forcing:ForcedTokens"
FORCED_KEY = "ekka_forced_tokens"


def forcing_change(forced_from: str) -> dict[str, Any]:
    """The configuration change a forced run records (a ``ConfigChange``'s fields: the report lists it)."""
    return {"arg": "sampled tokens", "served": "the engine's own", "traced": f"the {forced_from} run's, forced",
            "why": f"the traced run samples what the {forced_from} run sampled, so the reference made beside it on "
                   f"those tokens is its reference; forcing acts in the sampler, after the model (every traced "
                   f"module computes as unforced), and the logprobs compared are the raw ones"}


def _engine_env(args: dict[str, Any]) -> None:
    from ekka_core.capture.vllm_config import CPU_KVCACHE_GIB

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KVCACHE_GIB))
    # Read before the engine starts: an injected bug's plugin moves VLLM_CACHE_ROOT to a root of its own, while the
    # kernels (named by their text) are shared by every run (vllm_compat.share_inductor_kernels).
    os.environ.setdefault(vllm_compat.KERNEL_CACHE_ENV, vllm_compat.kernel_cache_root())
    tp = int(args.get("tensor_parallel_size", 1))
    if tp == 1:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    else:
        # CPU TP workers need explicit core binding, one group per rank ("Not enough allowed NUMA nodes").
        cores = os.cpu_count() or tp
        per = max(cores // tp, 1)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            f"{r * per}-{r * per + per - 1}" if per > 1 else str(r * per) for r in range(tp)))


def check_engine_args(args: dict[str, Any]) -> None:
    """Every argument must be one the installed vLLM's ``LLM`` accepts (its own parameters or an ``EngineArgs``
    field): a typo is bad input before an engine starts, named with vLLM's version and the nearest real name."""
    unknown = vllm_compat.unknown_engine_args(args)
    if unknown:
        near = difflib.get_close_matches(unknown[0], vllm_compat.llm_arg_names(), n=1)
        raise BadInput(f"vLLM {vllm_compat.version()} has no engine argument `{unknown[0]}`"
                       + (f" (did you mean `{near[0]}`?)" if near else ""),
                       fix="use an argument of vllm.engine.arg_utils.EngineArgs (as `vllm serve --help` lists them, "
                           "with _ for -)")


def _request_rejected(error: Exception) -> bool:
    """vLLM's input validation refusing a request (a prompt longer than ``max_model_len``): the user's input, not a
    crash."""
    return type(error).__name__ == "VLLMValidationError" or "maximum context length" in str(error)


def _start(args: dict[str, Any], model: str) -> Any:
    from vllm import LLM

    try:
        return LLM(**args)
    except TypeError as e:                         # vLLM's own complaint about an argument, named as such
        raise BadInput(f"vLLM rejects the engine arguments: {e}", fix="fix that engine argument") from e
    except Exception as e:
        text = str(e)
        lowered = text.lower()
        if "not supported" in lowered and "architecture" in lowered:
            raise engine_start_error("vLLM", model, e) from e     # the checkpoint, not an engine argument
        if "validation error" in lowered or "kv cache" in lowered or "max_model_len" in lowered \
                or "max_num_batched_tokens" in lowered or "block_size" in lowered:
            # The served configuration cannot start here (not enough KV cache, an invalid value): the engine's
            # own words, first telling line.
            line = next((ln.strip() for ln in text.splitlines()
                         if ln.strip() and ("Value error" in ln or "must" in ln or "larger" in ln
                                            or "KV cache" in ln or "Input should" in ln)),
                        text.splitlines()[0] if text else type(e).__name__)
            raise BadInput(f"vLLM cannot start with this configuration: {line}",
                           fix="change that engine argument (--engine-arg KEY=VALUE or the spec's [engine_args])") from e
        raise engine_start_error("vLLM", model, e) from e


def resolved_config(llm: Any) -> dict[str, Any]:
    """What the engine made of its arguments: the values each configuration factor really has in this run."""
    return resolved_from_config(vllm_compat.vllm_config_of(llm))


def resolved_from_config(vc: Any) -> dict[str, Any]:
    """:func:`resolved_config` from a ``VllmConfig`` (inside an engine process: the served-trace plugin)."""
    cc, sc, cache, mc = vc.compilation_config, vc.scheduler_config, vc.cache_config, vc.model_config
    return {"enforce_eager": bool(mc.enforce_eager), "compilation_mode": vllm_compat.compilation_mode_of(cc),
            "compilation_backend": str(cc.backend), "custom_ops": list(cc.custom_ops),
            "enable_prefix_caching": bool(cache.enable_prefix_caching), "block_size": cache.block_size,
            "kv_cache_dtype": str(cache.cache_dtype), "max_num_batched_tokens": sc.max_num_batched_tokens,
            "max_num_seqs": sc.max_num_seqs, "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
            "max_model_len": mc.max_model_len, "dtype": str(mc.dtype).removeprefix("torch.")}


def _params(spec: DiagnosisSpec, request: RequestSpec, forced: list[int] | None = None) -> Any:
    from vllm import SamplingParams

    values: dict[str, Any] = {"temperature": 0.0, "max_tokens": spec.max_new_tokens_of(request), "ignore_eos": True,
                              "logprobs": SAMPLE_LOGPROBS}
    values.update(request.sampling)
    if forced:                           # read by vllm_forcing.ForcedTokens in the engine
        values["extra_args"] = {**(values.get("extra_args") or {}), FORCED_KEY: list(forced)}
    try:
        return SamplingParams(**values)
    except (TypeError, ValueError) as e:
        raise BadInput(f"request {request.id!r}: sampling {request.sampling} is not valid for vLLM ({e})",
                       fix="use SamplingParams fields, e.g. sampling = { repetition_penalty = 1.2 }") from None


def _send(llm: Any, spec: DiagnosisSpec, requests: list[RequestSpec], wave: list[int],
          forced: list[list[int]] | None = None) -> list[Any]:
    """One wave: all its requests in one call, as a server batch would take them. Chat requests go through the
    engine's chat path (LLM.chat), the others through LLM.generate; one call cannot take both."""
    from vllm.inputs import TokensPrompt

    chat = [i for i in wave if requests[i].messages is not None]
    if chat and len(chat) != len(wave):
        raise BadInput(f"requests {[requests[i].id for i in wave]} are sent together but mix chat and prompt input",
                       fix="vLLM's LLM.chat and LLM.generate are separate calls: give the chat requests an `after` "
                           "of their own")
    params = [_params(spec, requests[i], forced[i] if forced and i < len(forced) else None) for i in wave]
    try:
        if chat:
            return llm.chat([requests[i].messages for i in wave], params, use_tqdm=False)
        prompts = [requests[i].prompt if requests[i].prompt is not None
                   else TokensPrompt(prompt_token_ids=list(requests[i].prompt_token_ids or [])) for i in wave]
        return llm.generate(prompts, params, use_tqdm=False)
    except ValueError as e:
        if "maximum model length" in str(e) or "max_model_len" in str(e) or "too long" in str(e):
            raise BadInput(f"a request of wave {[requests[i].id for i in wave]} does not fit: {e}",
                           fix="shorten it, lower max_new_tokens, or raise --engine-arg max_model_len=N") from None
        raise


def run(spec: DiagnosisSpec, out_dir: Path, args: dict[str, Any], *, label: str, trace: bool,
        config_changes: list[dict[str, Any]] | None = None, forced: list[list[int]] | None = None,
        forced_from: str = "") -> EngineOutputs:
    """Run the spec's requests on vLLM with exactly ``args``; trace every module call into ``out_dir`` when
    ``trace``. Writes ``out_dir/outputs.json`` and returns it.

    ``forced``: per request (the spec's order), the tokens the run ``forced_from`` sampled: this run samples them
    too (:mod:`ekka_core.capture.vllm_forcing`; recorded as a configuration change) where the engine allows it, and
    samples its own where it does not."""
    _engine_env(args)
    if trace:
        # Ekka's plugin then sums the weights as loaded, before the engine repacks them (vLLM-CPU's linears hand
        # their values to oneDNN and keep an empty `weight`): what the mapping compares by value.
        os.environ[WEIGHT_SUMS_ENV] = "1"
    check_engine_args(args)
    engine_args = args
    if forced and vllm_compat.token_forcing_unsupported(args) is None:
        # Not in `args`: those are the configuration recorded and compared; forcing adds no engine feature.
        engine_args = {**args, "logits_processors": [*(args.get("logits_processors") or []), FORCED_PROCESSOR]}
        config_changes = [*(config_changes or []), forcing_change(forced_from)]
    else:
        forced = None
    t0 = time.perf_counter()
    llm = _start(engine_args, spec.model)
    started = time.perf_counter() - t0
    resolved = resolved_config(llm)
    # Loaded from vLLM's compile cache or compiled in this run (rank 0's word: every rank compiles the same graph);
    # a compiled mode whose compilation vLLM's counters do not see (its cache disabled) compiled in this run.
    use = vllm_compat.collective_rpc(llm, "ekka_trace_control", ("compile_cache",))[0]
    resolved["compile_cache"] = use or ("compiled" if resolved["compilation_mode"] else "")
    requests = spec.request_list()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if trace:
        run_info = RunInfo(framework="vllm", framework_version=vllm_compat.version(), role="target", model=spec.model,
                           dtype=resolved["dtype"], engine_args={k: v for k, v in args.items() if k != "model"},
                           prompts=spec.labels(), resolved_config=resolved, config_changes=list(config_changes or []))
        # The worker method comes from Ekka's vLLM plugin, loaded by vLLM itself in every worker process.
        vllm_compat.collective_rpc(llm, "ekka_trace_control",
                                   ("start", str(out_dir), asdict(run_info), spec.trace_options()))

    failure = None
    outcomes: dict[int, tuple[Any, int]] = {}
    try:
        for w, wave in enumerate(spec.waves()):
            for i, o in zip(wave, _send(llm, spec, requests, wave, forced)):
                outcomes[i] = (o, w)
    except BadInput:
        if trace:
            _close_trace(llm, {}, [], [], [], [], [], "stopped by bad input")
        raise
    except Exception as e:  # noqa: BLE001 - the trace so far is kept, marked incomplete
        if _request_rejected(e):
            if trace:
                _close_trace(llm, {}, [], [], [], [], [], "stopped by bad input")
            raise BadInput(f"vLLM refuses a request: {str(e).splitlines()[0]}",
                           fix=f"raise max_model_len (now {resolved.get('max_model_len')}; --engine-arg "
                               "max_model_len=N, at most the checkpoint's positions) or shorten the prompt") from e
        failure = f"vLLM crashed during generation: {type(e).__name__}: {e}"

    result = EngineOutputs(framework="vllm", framework_version=vllm_compat.version(), label=label, args=args,
                           resolved=resolved, dtype=resolved["dtype"], traced=trace, start_seconds=started,
                           forced_tokens_from=forced_from if forced else "")
    for i in sorted(outcomes):
        o, w = outcomes[i]
        result.requests.append(RequestOutcome(
            request=i, prompt_token_ids=list(o.prompt_token_ids), generated=list(o.outputs[0].token_ids),
            logprobs=[{int(t): float(lp.logprob) for t, lp in step.items()} for step in (o.outputs[0].logprobs or [])],
            num_cached_tokens=int(o.num_cached_tokens or 0), wave=w))
    if trace:
        seq_by_req = {outcomes[i][0].request_id: i for i in outcomes}
        prompts = [r.prompt_token_ids for r in result.requests]
        generated = [r.generated for r in result.requests]
        token_ids = [r.fed_token_ids for r in result.requests]
        cached = [r.num_cached_tokens for r in result.requests]
        _close_trace(llm, seq_by_req, [len(p) for p in prompts], token_ids, generated, prompts, cached, failure)
        tp = int(args.get("tensor_parallel_size", 1))
        if tp > 1 and failure is None:
            from ekka_core.capture.unshard import unshard
            unshard([out_dir / f"rank-{r}" for r in range(tp)], out_dir)
    result.seconds = round(time.perf_counter() - t0, 2)
    result.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result.save(out_dir)
    if failure:
        raise InternalFailure(failure + (f" (partial trace kept in {out_dir}, marked incomplete)" if trace else ""))
    return result


def _close_trace(llm: Any, seq_by_req: dict[str, int], prompt_lens: list[int], token_ids: list[list[int]],
                 generated: list[list[int]], prompts: list[list[int]], cached: list[int], failure: str | None) -> None:
    try:
        vllm_compat.collective_rpc(llm, "ekka_trace_control", ("close", seq_by_req, prompt_lens, token_ids,
                                                               generated, prompts, failure, cached))
    except Exception as e:  # a dead engine cannot close its workers' traces; they stay on disk, unindexed
        raise InternalFailure(f"{failure or 'vLLM failed'}; closing the traces failed too ({e})") from e
