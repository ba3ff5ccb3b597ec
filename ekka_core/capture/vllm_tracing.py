"""Tracing inside a vLLM worker process: attach a ModuleTracer to the worker's model, close it on request.

Used by Ekka's vLLM plugin in every worker (in-process engine, multiprocess engine core, each tensor-parallel
rank). With tensor parallelism each rank writes its own trace under ``rank-<k>/`` with the metadata needed to
unshard it (:mod:`ekka_core.capture.unshard`).
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ekka_core.capture.hooks import ModuleTracer, tracer_for
from ekka_core.capture.rows import RowLedger
from ekka_core.capture.trace import RunInfo, TraceWriter
from ekka_core.capture.unshard import tp_layout

_TRACER: ModuleTracer | None = None
_SERVED: "ServedRequests | None" = None
_ROWS: RowLedger | None = None


def active() -> ModuleTracer | None:
    return _TRACER


def start(worker: Any, out_dir: str, run: dict[str, Any], options: dict[str, str] | None = None
          ) -> dict[str, Any]:
    return start_on_runner(worker.model_runner, out_dir, run, options=options)


def start_on_runner(runner: Any, out_dir: str, run: dict[str, Any], *, served: bool = False,
                    options: dict[str, str] | None = None) -> dict[str, Any]:
    """Attach a tracer to the runner's model. ``served``: nobody will tell the tracer which requests were whose
    (``vllm serve``, a user's own script): it learns each request's tokens from the rows it sees, and
    :func:`step_done` closes the trace on disk after every step."""
    global _TRACER
    from ekka_core.capture import vllm_compat

    model = runner.get_model()
    tp_rank, tp_size = vllm_compat.tp_rank_and_size()
    directory = Path(out_dir) / f"rank-{tp_rank}" if tp_size > 1 else Path(out_dir)
    known = {f.name for f in fields(RunInfo)}
    info = RunInfo(**{"framework_version": vllm_compat.version(), **{k: v for k, v in run.items() if k in known}})
    info.tp_rank, info.tp_size = tp_rank, tp_size
    info.declared = declared_weight_mapping(model)
    info.declared["tp_layout"] = tp_layout(model)
    writer = TraceWriter(directory, info)
    global _SERVED, _ROWS
    _SERVED = ServedRequests() if served else None
    _ROWS = RowLedger()      # a driven run's rows, proved against what the driver says it fed (close)

    def layout(args: tuple, kwargs: dict) -> tuple[list[Any], list[int]]:
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        pos = positions.tolist()
        req_ids, starts = vllm_compat.runner_rows(runner)
        reqs: list[Any] = [None] * len(pos)  # rows past the last request are padding
        for i, rid in enumerate(req_ids):
            for row in range(starts[i], starts[i + 1]):
                reqs[row] = rid
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if _SERVED is not None:
            _SERVED.see(reqs, pos, input_ids, vllm_compat.runner_requests(runner))
        elif _ROWS is not None:
            _ROWS.see(reqs, pos, input_ids)
        return reqs, pos

    _TRACER = tracer_for(writer, layout, options).attach(model)
    return {"rank": tp_rank, "dir": str(directory), "pid": os.getpid()}


def step_done(failure: str | None = None) -> None:
    """After each engine step of a served run: rewrite the index so the trace on disk describes every step so far,
    closed and usable at once — a server is stopped by signals that may kill its workers before any exit hook."""
    if _TRACER is not None and _SERVED is not None:
        _SERVED.write_into(_TRACER, failure)


def close_served() -> None:
    """At engine exit: the last step's index, and the hooks removed."""
    global _TRACER, _SERVED
    if _TRACER is None or _SERVED is None:
        return
    _TRACER.detach()
    _SERVED.write_into(_TRACER)
    _TRACER = _SERVED = None


def close(seq_by_req: dict[str, int], prompt_lens: list[int], token_ids: list[list[int]],
          generated: list[list[int]], own_prompt_ids: list[list[int]], failure: str | None,
          cached: list[int] | None = None) -> dict[str, Any]:
    """Close a driven run's trace. ``token_ids`` is what the driver says each sequence fed (the engine's
    ``prompt_token_ids`` + generated tokens), ``cached`` how many prompt tokens of each came from the prefix cache:
    the rows the hooks saw must be exactly those tokens at those positions, every position past the cached prefix
    computed once — otherwise the trace is marked incomplete with what did not line up."""
    global _TRACER, _SERVED, _ROWS
    tracer = _TRACER
    if tracer is None:
        return {"calls": 0, "steps": 0, "fired": 0}
    tracer.detach()
    rows, _SERVED, _ROWS = _ROWS, None, None

    def seq_of(rid: str) -> int:
        if rid in seq_by_req:
            return seq_by_req[rid]
        for ext, s in seq_by_req.items():   # the engine may suffix the external id ("0-3f2a…")
            if rid.startswith(ext + "-"):
                return s
        return -1

    run = tracer.writer.run
    run.token_ids, run.prompt_lens, run.generated_ids = token_ids, prompt_lens, generated
    run.own_prompt_token_ids = own_prompt_ids
    run.cached_tokens = list(cached or [])
    if seq_by_req:
        tracer.resolve_steps(seq_of, prompt_lens)
    else:
        tracer.keep_raw_requests()
    if seq_by_req and rows is not None and failure is None and tracer.fired:
        by_rid = {rid: seq_of(rid) for rid in rows.tokens}
        problems = rows.proof({rid: s for rid, s in by_rid.items() if s >= 0}, token_ids, cached=cached)
        failure = "; ".join(problems) or None
    ok = failure is None and tracer.fired > 0 and bool(seq_by_req)
    tracer.writer.close(complete=ok, failure=failure or (None if tracer.fired else "no module hook fired: the "
                                                         "model ran under CUDA graphs or torch.compile"))
    _TRACER = None
    return {"calls": len(tracer.writer.calls), "steps": len(tracer.writer.steps), "fired": tracer.fired,
            "rank": run.tp_rank}


class ServedRequests:
    """The requests of a run Ekka does not drive, learnt from the rows the model processes (a
    :class:`~ekka_core.capture.rows.RowLedger`) and their prompt lengths from the runner's request state. A request's
    tokens are its prompt plus the generated tokens fed back in."""

    def __init__(self) -> None:
        self.rows = RowLedger()
        self.prompt_len: dict[str, int] = {}
        self.prompts: dict[str, list[int]] = {}

    def see(self, reqs: list[Any], pos: list[int], input_ids: Any, requests: dict[str, Any]) -> None:
        for rid in reqs:
            if rid is not None and rid not in self.prompt_len:
                prompt = getattr(requests.get(rid), "prompt_token_ids", None)
                if prompt is not None:
                    self.prompt_len[rid] = len(prompt)
                    self.prompts[rid] = list(prompt)
        self.rows.see(reqs, pos, input_ids)

    def write_into(self, tracer: ModuleTracer, failure: str | None = None) -> None:
        """Name every recorded step's sequences and phases and write the index: complete unless a step failed,
        a request's tokens are not all known, or no hook fired."""
        seq_by_req, token_ids, prompt_lens, problem = self.rows.sequences(self.prompt_len, self.prompts)
        run = tracer.writer.run
        run.token_ids, run.prompt_lens = token_ids, prompt_lens
        run.cached_tokens = list(self.rows.cached)
        run.generated_ids = [ids[n:] for ids, n in zip(token_ids, prompt_lens)]
        tracer.resolve_steps(lambda rid: seq_by_req.get(rid, -1), prompt_lens)
        failure = failure or problem or (None if tracer.fired else "no module hook fired: the model ran under "
                                                                   "CUDA graphs or torch.compile")
        tracer.writer.close(complete=failure is None, failure=failure)


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
