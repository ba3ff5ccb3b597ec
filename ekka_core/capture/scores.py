"""The reference's logprobs at the positions an engine sampled (:class:`~ekka_core.contracts.scores.ReferenceScores`):
each request's steps read from the reference's logits by :func:`scored_request` — for a reference run of its own
(:func:`ekka_core.capture.hf_runner.score`) and here, from the reference traces of a traced run.

A traced run's reference is already teacher-forced on the engine's tokens, and its traces hold the model's final
logits for every position: the symptom check of the traced configuration needs no further reference run.
"""

from __future__ import annotations

import torch

from ekka_core.capture.trace import TensorRef, Trace
from ekka_core.contracts.scores import ReferenceScores, ScoredRequest, ScoredRun, ScoredStep
from ekka_core.contracts.serving import EngineOutputs, RequestOutcome


def scored_request(outcome: RequestOutcome, logits: torch.Tensor) -> ScoredRequest | None:
    """The reference's logprobs at every step ``outcome`` sampled, for the token ids the engine reported there.
    ``logits``: the reference's ``[positions, vocab]`` logits over the engine's prompt + generated ids. None when
    they do not reach every sampled step."""
    start = len(outcome.prompt_token_ids) - 1            # the row that sampled generated[0]
    rows = logits[start:start + len(outcome.generated)].float().log_softmax(-1)
    if rows.shape[0] < len(outcome.logprobs):
        return None
    steps = []
    for j, top in enumerate(outcome.logprobs):
        tokens = sorted(top)
        steps.append(ScoredStep(tokens=tokens, logprobs=rows[j, tokens].tolist(), argmax=int(rows[j].argmax())))
    return ScoredRequest(request=outcome.request, steps=steps)


def scores_from_traces(outputs: EngineOutputs, reference: Trace, reference_fp32: Trace) -> ReferenceScores | None:
    """The scores of a traced run from its reference traces, or None when the traces do not hold all that is
    needed (a trace restricted to some positions or modules, MoE routing ties): the caller then scores with a
    reference run of its own."""
    if _routing_ties(reference, reference_fp32):
        # An MoE run with routing ties needs the second noise floor, the reference routed the other way at each
        # tie (:func:`ekka_core.capture.hf_runner.score`): a reference pass the traces do not hold. Asked first, so
        # the logits rows are not read for nothing.
        return None
    low, high = _score(outputs, reference), _score(outputs, reference_fp32)
    if low is None or high is None:
        return None
    return ReferenceScores(low=low, fp32=high, own_prompt_token_ids=reference.run.own_prompt_token_ids)


def _routing_ties(reference: Trace, reference_fp32: Trace) -> dict[int, list[int]]:
    """Per request, the positions whose MoE routing is a tie within the reference's rounding (as
    :func:`ekka_core.capture.hf_runner.routing_ties`), from the reference traces' router calls."""
    from ekka_core.capture.routing import traced_router_ties

    tied: dict[int, set[int]] = {}
    for call, rows, _, _ in traced_router_ties(reference, reference_fp32):
        step = reference_fp32.steps[call.step]
        for row in torch.nonzero(rows).flatten().tolist():
            tied.setdefault(int(step.seq[row]), set()).add(step.pos[row])
    return {k: sorted(v) for k, v in tied.items()}


def _score(outputs: EngineOutputs, trace: Trace) -> ScoredRun | None:
    if trace.run.trace_options.get("positions") or trace.run.trace_options.get("include"):
        return None
    roots = [c for c in trace.calls_of("") if "logits" in c.output_names]
    by_seq = {}
    for call in roots:
        seqs = set(trace.steps[call.step].seq)
        if len(seqs) == 1:
            by_seq[seqs.pop()] = call
    scored = []
    for r in outputs.requests:
        call = by_seq.get(r.request)
        if call is None:
            return None
        ref = call.outputs[call.output_names.index("logits")]
        if not isinstance(ref, TensorRef):
            return None
        request = scored_request(r, trace.tensor(ref).reshape(-1, ref.shape[-1]))
        if request is None:
            return None
        scored.append(request)
    trace.release()
    return ScoredRun(dtype=trace.run.dtype.removeprefix("torch."), requests=scored)
