"""Reference runner for HF Transformers: teacher-forced on the target's tokens, in fp32 and in low precision.

Teacher forcing (one forward over prompt + generated tokens) makes every reference position line up with a
target position, decode steps included. The reference runs HF's literal ``eager`` attention: the fast ``sdpa``
path silently drops Gemma-2's attention soft-capping, and a wrong reference would blame a correct engine.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from ekka_core.capture.hooks import ModuleTracer, tracer_for
from ekka_core.capture.residency import letting_go_while_loading, release_after_forward, stored_float_dtype
from ekka_core.capture.scores import scored_request
from ekka_core.capture.trace import RunInfo, TraceWriter
from ekka_core.contracts.errors import BadInput, InternalFailure
from ekka_core.contracts.scores import ReferenceScores, ScoredRun
from ekka_core.contracts.serving import EngineOutputs
from ekka_core.contracts.spec import DiagnosisSpec, RequestSpec

ATTN_IMPLEMENTATION = "eager"


def own_inputs(model: str, requests: list[RequestSpec]) -> list[list[int]]:
    """The token ids the reference's own pipeline makes of each request as the user sent it: HF's tokenizer for
    prompt text (special tokens as the tokenizer adds them), HF's ``apply_chat_template`` for chat messages (the
    template writes the special tokens; nothing is added on top), the ids themselves when given. The pre-flight
    compares them with the ids the engine actually fed the model."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    out = []
    for r in requests:
        if r.prompt is not None:
            out.append(list(tok(r.prompt)["input_ids"]))
        elif r.messages is not None:
            try:
                ids = tok.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=True)
            except (ValueError, TypeError) as e:   # no chat template, or one that rejects these messages
                raise BadInput(f"HF Transformers cannot render request {r.id!r} as chat: {e}",
                               fix="give the checkpoint a chat template (tokenizer_config.json / chat_template.jinja) "
                                   "or send prompt text") from None
            out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        else:
            out.append(list(r.prompt_token_ids or []))
    return out


def score(spec: DiagnosisSpec, outputs: EngineOutputs, dtype: str,
          routers: dict[int, list[tuple[torch.Tensor, int]]] | None = None,
          reroute: dict[int, list[torch.Tensor]] | None = None) -> ScoredRun:
    """Teacher-force HF on what the engine fed and generated, and read its logprobs where the engine sampled, for
    the token ids the engine reported (its top-k) — the symptom check's reference, one forward per request.
    ``routers`` (when given) receives, per request, every MoE router call's (logits, k) in execution order.
    ``reroute`` (per request, per router call in execution order, a mask of token rows) sends those tokens to their
    (k+1)-th expert instead of their k-th: the reference as a correct engine whose rounding broke the tie the other
    way (:func:`routing_tie_masks`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec.model, dtype=getattr(torch, dtype),
                                                 attn_implementation=ATTN_IMPLEMENTATION)
    model.eval()
    calls: list[tuple[torch.Tensor, int]] = []
    masks: list[torch.Tensor] = []

    def on_router(_m: Any, _i: Any, out: Any) -> Any:
        index = len(calls)
        _record_router(out, calls)
        if reroute is not None and index < len(masks):
            return _route_ties_elsewhere(out, masks[index])
        return None

    gates = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "gate"]
    handles = [m.register_forward_hook(on_router) for m in gates] if routers is not None or reroute else []
    scored = []
    with torch.no_grad():
        for r in outputs.requests:
            ids = r.fed_token_ids
            calls.clear()
            masks[:] = (reroute or {}).get(r.request, [])
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
            if routers is not None:
                routers[r.request] = list(calls)
            request = scored_request(r, logits)
            if request is None:
                raise InternalFailure(f"engine outputs: request {r.request} reports logprobs for "
                                      f"{len(r.logprobs)} steps but generated only {len(r.generated)} tokens")
            scored.append(request)
    for h in handles:
        h.remove()
    return ScoredRun(dtype=dtype, requests=scored)


def reference_scores(spec: DiagnosisSpec, outputs: EngineOutputs) -> ReferenceScores:
    """The reference's logprobs at every position the engine sampled, in the engine's dtype and in fp32, with the
    MoE routing ties and (when there are any) the second noise floor; the ids the reference makes of each
    request."""
    low_routers: dict[int, list[tuple[torch.Tensor, int]]] = {}
    fp32_routers: dict[int, list[tuple[torch.Tensor, int]]] = {}
    low = score(spec, outputs, outputs.dtype, low_routers)
    high = score(spec, outputs, "float32", fp32_routers)
    ties = routing_tie_masks(low_routers, fp32_routers)
    tied = routing_ties(ties)
    # The second noise floor: the reference with every tied token routed the other way.
    rerouted = score(spec, outputs, outputs.dtype, reroute=ties) if tied else None
    return ReferenceScores(low=low, fp32=high, own_prompt_token_ids=own_inputs(spec.model, spec.request_list()),
                           routing_ties=tied, low_rerouted=rerouted)


def _router_outputs(out: Any) -> tuple[int, int] | None:
    """Where an MoE router's output (HF: logits ``[tokens, experts]``, weights and expert ids ``[tokens, k]``) holds
    its expert ids and its logits: ``(ids index, logits index)`` in the output tuple, or None for another layout."""
    outs = out if isinstance(out, tuple) else (out,)
    ids = next((i for i, t in enumerate(outs)
                if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dim() >= 2), None)
    if ids is None:
        return None
    logits = next((i for i, t in enumerate(outs) if isinstance(t, torch.Tensor) and t.is_floating_point()
                   and t.dim() >= 2 and t.shape[-1] > outs[ids].shape[-1]), None)
    return None if logits is None else (ids, logits)


def _record_router(out: Any, calls: list[tuple[torch.Tensor, int]]) -> None:
    where = _router_outputs(out)
    if where is None:
        return
    outs = out if isinstance(out, tuple) else (out,)
    logits, ids = outs[where[1]], outs[where[0]]
    calls.append((logits.detach().float().reshape(-1, logits.shape[-1]), int(ids.shape[-1])))


def _route_ties_elsewhere(out: Any, tied: torch.Tensor) -> Any:
    """The router's output with each tied token's k-th expert replaced by its (k+1)-th (by this pass's own logits).
    The routing weights are kept: a tie means the two experts' logits are equal within rounding, so are their
    weights."""
    where = _router_outputs(out)
    if where is None or not isinstance(out, tuple) or not tied.any():
        return None
    ids_at, logits_at = where
    ids = out[ids_at].clone()
    flat = ids.reshape(-1, ids.shape[-1])
    k = flat.shape[-1]
    order = out[logits_at].detach().float().reshape(flat.shape[0], -1).topk(k + 1, dim=-1).indices
    for row in torch.nonzero(tied[:flat.shape[0]]).flatten().tolist():
        kth, nxt = order[row, k - 1], order[row, k]
        flat[row][flat[row] == kth] = nxt
    return tuple(ids if i == ids_at else t for i, t in enumerate(out))


def routing_tie_masks(low: dict[int, list[tuple[torch.Tensor, int]]],
                      fp32: dict[int, list[tuple[torch.Tensor, int]]]) -> dict[int, list[torch.Tensor]]:
    """Per request, per router call in execution order, the token rows whose expert routing is a tie within the
    reference's rounding noise (:func:`ekka_core.capture.routing.routing_tie_rows`)."""
    from ekka_core.capture.routing import routing_tie_rows

    return {request: [routing_tie_rows(y, x, k)[0] for (y, k), (x, _) in zip(calls, low.get(request, []))]
            for request, calls in fp32.items()}


def routing_ties(masks: dict[int, list[torch.Tensor]]) -> dict[int, list[int]]:
    """Per request, the token positions tied in some layer (from :func:`routing_tie_masks`)."""
    out: dict[int, list[int]] = {}
    for request, calls in masks.items():
        tied = sorted({row for m in calls for row in torch.nonzero(m).flatten().tolist()})
        if tied:
            out[request] = tied
    return out


# Functions HF calls inside a module's forward that compute a component engines implement as a module
# (vLLM's RotaryEmbedding): traced as pseudo-modules named after their caller.
TRACED_FUNCTIONS = ("apply_rotary_pos_emb",)


def _trace_functions(model: Any, tracer: ModuleTracer) -> Any:
    import sys

    modeling = sys.modules[type(model).__module__]
    originals = {}
    for name in TRACED_FUNCTIONS:
        fn = getattr(modeling, name, None)
        if fn is None:
            continue
        originals[name] = fn

        def traced(*args: Any, __fn: Any = fn, __name: str = name, **kwargs: Any) -> Any:
            out = __fn(*args, **kwargs)
            tracer.record_function(__name, __fn, args[:2], out)   # (q, k) in; (q_embed, k_embed) out
            return out

        setattr(modeling, name, traced)

    def restore() -> None:
        for name, fn in originals.items():
            setattr(modeling, name, fn)

    return restore


def load_model(model: str, dtype: torch.dtype) -> Any:
    """The reference model in ``dtype``, exactly as ``from_pretrained(dtype=…)`` makes it, holding no more memory than
    it computes with (:mod:`~ekka_core.capture.residency`): where every tensor is converted from the stored dtype, the
    checkpoint's pages are let go as the load reads them; where the weights are views of the mapped checkpoint (it
    stores ``dtype``), each module's are let go after its forward."""
    from transformers import AutoModelForCausalLM

    stored = stored_float_dtype(model)
    scope = letting_go_while_loading(model) if stored is not None and stored != dtype else contextlib.nullcontext()
    try:
        with scope:
            loaded = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    except (OSError, ValueError, KeyError) as e:
        raise BadInput(f"HF Transformers cannot load {model}: {str(e).splitlines()[0]}",
                       fix="pass a HF checkpoint directory whose architecture Transformers supports") from e
    loaded.eval()
    release_after_forward(loaded)
    return loaded


def run(spec: DiagnosisSpec, token_ids: list[list[int]], prompt_lens: list[int], dtype: str, role: str,
        out_dir: Path, *, weight_sums: dict[str, list[float]] | None = None,
        delta_base: Path | None = None) -> dict[str, Any]:
    """Trace HF teacher-forced on ``token_ids`` in ``dtype`` into ``out_dir``. ``weight_sums``: those of another run
    of this checkpoint in this process (:func:`~ekka_core.capture.hooks.weight_sums` rounds to bf16 first, so an
    fp32 and a bf16 load of one checkpoint give the same), not computed again. ``delta_base``: the low-precision
    reference's trace of the same tokens, which this (fp32) run's float32 tensors are stored over
    (:class:`~ekka_core.capture.trace.TraceWriter`)."""
    import transformers

    model = load_model(spec.model, getattr(torch, dtype))

    current: dict[str, Any] = {}

    def layout(args: tuple, kwargs: dict) -> tuple[list[Any], list[int]]:
        n = len(token_ids[current["seq"]])
        return [current["seq"]] * n, list(range(n))

    run_info = RunInfo(framework="hf", framework_version=transformers.__version__, role=role, model=spec.model,
                       dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION, prompts=spec.labels(),
                       own_prompt_token_ids=own_inputs(spec.model, spec.request_list()),
                       token_ids=token_ids, prompt_lens=prompt_lens)
    writer = TraceWriter(out_dir, run_info, delta_base=delta_base)
    if weight_sums is not None:
        model._ekka_weight_sums = weight_sums
    tracer = tracer_for(writer, layout, spec.trace_options(), reference=role.startswith("reference")).attach(model)
    restore = _trace_functions(model, tracer)
    try:
        with torch.no_grad():
            for i, ids in enumerate(token_ids):
                current["seq"] = i
                model(input_ids=torch.tensor([ids]), use_cache=False)
    except Exception as e:
        tracer.detach()
        restore()
        writer.close(complete=False, failure=f"{type(e).__name__}: {e}")
        raise
    tracer.detach()
    restore()
    tracer.resolve_steps(lambda s: s, prompt_lens)
    for step in writer.steps:
        step.phase = "teacher-forced"   # one pass over prompt and generated tokens together
    writer.close(complete=tracer.fired > 0, failure=None if tracer.fired else "no module hook fired")
    return {"calls": len(writer.calls), "steps": len(writer.steps), "weight_sums": run_info.weight_sums}
