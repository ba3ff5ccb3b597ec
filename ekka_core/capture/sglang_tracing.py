"""Tracing inside SGLang's scheduler processes (one per tensor-parallel rank), driven by :mod:`sglang_runner`.

How the hooks get there: SGLang starts each scheduler with ``Engine.run_scheduler_process_func`` in a process of
its own (multiprocessing spawn). The driver subclasses ``sglang.Engine`` with that function replaced by
:func:`run_scheduler_process`, which adds a ``Scheduler.ekka_trace_control`` method in the new process and then
runs SGLang's own scheduler process unchanged. The driver reaches every rank with
``Engine.collective_rpc("ekka_trace_control", request=JSON)`` (SGLang calls ``getattr(scheduler, method)(**kwargs)``
on each scheduler and allows flat scalars only, hence one JSON string): ``start`` after the engine is built (so no
warm-up pass is traced) and before generation, ``close`` after it. Nothing is installed, no environment variable
or plugin is needed, and only the engine Ekka builds is traced.

Per forward the layout comes from SGLang's ``ForwardBatch`` (:func:`batch_layout`, pure and duck-typed): rows are
laid out request by request in ``forward_batch.rids`` order — ``extend_seq_lens_cpu[i]`` rows per request in an
EXTEND/MIXED pass (chunked prefill and decode requests mixed into a prefill are 1-token extends), one row per
request in a DECODE pass — and positions are the ``positions`` tensor the model receives. A ledger of every row
(request, position, token id) proves at close that each fed token was traced exactly once with the expected id
(:class:`~ekka_core.capture.rows.RowLedger`); a trace that fails the proof is kept but marked incomplete with the
reason.

SGLang's runners call ``model.forward(...)`` directly, which skips the root module's hooks (and the tracer starts a
step in the root's pre-hook): :func:`route_forward_through_call` sends that call through ``nn.Module.__call__``.

Verified on CPU (tests/capture/test_sglang_capture.py): the layout on SGLang-shaped batches (several requests of different
lengths, chunked prefill, mixed, decode, padding, unsupported modes), the row proof, the forward routing, a real
ModuleTracer on a small SGLang-shaped model writing a real trace that round-trips through the loader and lines up
row by row with HF's teacher-forced trace (and passes the pipeline's alignment proof), the RPC, the
scheduler-process wrapper, tensor-parallel rank traces and their unsharding, and the driver end to end against a
fake ``sglang`` that follows the 0.5.23 API as read from its sources; the sources themselves are checked, parsed
and never imported, for every name this relies on. Only on a CUDA machine (scripts/gpu-check.sh): that a real
SGLang honours ``run_scheduler_process_func`` in its spawned schedulers, that ``collective_rpc`` reaches each of
them, that real batches carry these fields with these meanings, that CUDA graphs are really off, real
tensor-parallel sharding (``tp_layout`` from SGLang's linears), and a whole diagnosis. SGLang 0.5's decoder layers
return their FFN contribution and carry the residual outside, so their output is not HF's hidden state: the mapping
compares them through their parts (``ekka_core.mapping.SGLANG_LAYER_REASON``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from ekka_core.capture.hooks import ModuleTracer, tracer_for
from ekka_core.capture.rows import RowLedger
from ekka_core.capture.trace import RunInfo, TraceWriter
from ekka_core.capture.unshard import tp_layout

CONTROL_METHOD = "ekka_trace_control"
_STATE = "_ekka_tracing"    # the Scheduler attribute holding its Tracing while a trace is open


# -- the layout of one forward pass ---------------------------------------------------------------------------------
@dataclass
class BatchLayout:
    reqs: list[str | None]     # request id per row (None: a row no request owns)
    pos: list[int]             # position per row
    mode: str                  # ForwardMode name: EXTEND, MIXED, DECODE, IDLE, …
    problem: str | None = None


# Forward modes whose rows Ekka can lay out. Speculative decoding (TARGET_VERIFY, DRAFT_EXTEND_V2), split prefill
# and dLLM passes lay rows out differently; they are refused by the driver's engine arguments and, should one run
# anyway, reported here instead of guessed.
_EXTEND_MODES = ("EXTEND", "MIXED")
_DECODE_MODES = ("DECODE",)
_IDLE_MODES = ("IDLE",)


def forward_batch_of(args: tuple, kwargs: dict) -> Any:
    """The ForwardBatch among a model forward's arguments (``forward(input_ids, positions, forward_batch, …)``)."""
    fb = kwargs.get("forward_batch")
    if fb is not None:
        return fb
    return next((a for a in args if hasattr(a, "forward_mode")), None)


def batch_layout(forward_batch: Any, positions: Any) -> BatchLayout:
    """Which request and position each row of this forward is, from SGLang's ForwardBatch.

    ``positions`` is the tensor the model was given (``forward_batch.positions`` when None). Request ids are
    ``forward_batch.rids``; a release without them falls back to the request-pool slots (stable while a request
    lives, which covers one batch of prompts)."""
    mode_obj = getattr(forward_batch, "forward_mode", None)
    mode = getattr(mode_obj, "name", str(mode_obj))
    if positions is None or positions.dim() > 1:   # multimodal-rope models get [3, rows]; the batch keeps 1-D
        positions = getattr(forward_batch, "positions", None)
    pos = [int(p) for p in positions.tolist()] if positions is not None else []
    rids = getattr(forward_batch, "rids", None)
    if rids is None:
        slots = getattr(forward_batch, "req_pool_indices", None)
        rids = [f"slot:{int(s)}" for s in slots.tolist()] if slots is not None else []
    rids = [str(r) for r in rids]

    if mode in _DECODE_MODES:
        rows = [1] * len(rids)
    elif mode in _EXTEND_MODES:
        lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
        if lens is None and getattr(forward_batch, "extend_seq_lens", None) is not None:
            lens = forward_batch.extend_seq_lens.tolist()
        rows = [int(n) for n in (lens or [])]
    elif mode in _IDLE_MODES:
        rows = []
    else:
        return BatchLayout([None] * len(pos), pos, mode,
                           f"SGLang ran a {mode} forward, whose rows Ekka cannot assign to requests "
                           "(speculative decoding, split prefill?)")
    reqs: list[str | None] = [rid for rid, n in zip(rids, rows) for _ in range(n)]
    problem = None
    if len(rows) != len(rids) or len(reqs) > len(pos):
        problem = (f"a {mode} forward has {len(pos)} rows but its batch describes {len(reqs)} "
                   f"({len(rids)} requests, row counts {rows[:8]})")
        reqs = reqs[: len(pos)]
    reqs += [None] * (len(pos) - len(reqs))   # rows past the last request are padding
    return BatchLayout(reqs, pos, mode, problem)


def layout_of_call(args: tuple, kwargs: dict) -> BatchLayout:
    """:func:`batch_layout` of one call of the model's forward, from its arguments."""
    fb = forward_batch_of(args, kwargs)
    positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
    if fb is None:
        n = len(positions) if positions is not None else 0
        return BatchLayout([None] * n, list(range(n)), "?", "a model forward without a ForwardBatch argument")
    return batch_layout(fb, positions)


# -- getting hooks to fire ------------------------------------------------------------------------------------------
def route_forward_through_call(model: Any) -> Callable[[], None]:
    """Make ``model.forward(...)`` — how SGLang's runners call the model — run through ``nn.Module.__call__`` so the
    root's hooks fire. A pair of hooks marks when ``__call__`` is already running, so ``model(...)`` is not routed
    twice. Returns a function that undoes it."""
    from torch import nn

    bound = model.forward
    state = {"inside": False}

    def enter(module: Any, args: tuple) -> None:
        state["inside"] = True

    def leave(module: Any, args: tuple, output: Any) -> None:
        state["inside"] = False

    @functools.wraps(bound)   # keeps the signature SGLang inspects (``pp_proxy_tensors`` support)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if state["inside"]:
            return bound(*args, **kwargs)
        return nn.Module.__call__(model, *args, **kwargs)

    handles = [model.register_forward_pre_hook(enter, prepend=True),
               model.register_forward_hook(leave, always_call=True)]
    model.forward = forward

    def restore() -> None:
        for h in handles:
            h.remove()
        if model.__dict__.get("forward") is forward:
            del model.forward

    return restore


def graph_runners_in_use(model_runner: Any) -> list[str]:
    """Graph runners a ModelRunner would replay instead of running modules (hooks never fire in a replay):
    ``decode_cuda_graph_runner``, ``prefill_cuda_graph_runner`` (0.5.x; its eager stand-in is fine),
    ``cuda_graph_runner`` / ``piecewise_cuda_graph_runner`` (older releases)."""
    names = []
    for name, value in vars(model_runner).items():
        if name.endswith("graph_runner") and value and type(value).__name__ != "EagerRunner":
            names.append(name)
    return sorted(names)


# -- what SGLang declares about the model ---------------------------------------------------------------------------
def packed_from_stacked(stacked: Any) -> dict[str, list[str]]:
    """SGLang's ``stacked_params_mapping`` ([(".qkv_proj", ".q_proj", "q"), …]: fused parameter, HF part, shard)
    as a ``packed_modules_mapping`` ({"qkv_proj": ["q_proj", "k_proj", "v_proj"]}), parts in shard order."""
    packed: dict[str, list[str]] = {}
    for entry in stacked or []:
        if not isinstance(entry, (tuple, list)) or len(entry) < 2:
            continue
        fused, part = str(entry[0]).strip("."), str(entry[1]).strip(".")
        if part not in packed.setdefault(fused, []):
            packed[fused].append(part)
    return packed


def declared_weight_mapping(model: Any) -> dict[str, Any]:
    """What SGLang declares about loading HF checkpoints into this model: vLLM's attributes where SGLang kept them,
    else the fused weights of its ``stacked_params_mapping``."""
    from ekka_core.capture.vllm_tracing import declared_weight_mapping as vllm_style

    declared = vllm_style(model)
    if not declared.get("packed_modules_mapping"):
        declared["packed_modules_mapping"] = packed_from_stacked(getattr(model, "stacked_params_mapping", None))
    return declared


# -- in the scheduler process ---------------------------------------------------------------------------------------
def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """``Engine.run_scheduler_process_func`` for a traced engine: SGLang's own scheduler process, with
    :func:`trace_control` added to its Scheduler class (in this process only)."""
    from sglang.srt.managers import scheduler as sglang_scheduler

    setattr(sglang_scheduler.Scheduler, CONTROL_METHOD, trace_control)
    return sglang_scheduler.run_scheduler_process(*args, **kwargs)


def model_runner_of(scheduler: Any) -> Any:
    worker = scheduler.tp_worker
    runner = getattr(worker, "model_runner", None)
    if runner is None and hasattr(worker, "worker"):   # older releases wrap the worker for overlap scheduling
        runner = worker.worker.model_runner
    return runner


def trace_control(scheduler: Any, request: str) -> None:
    """Scheduler method the driver calls on every rank through ``Engine.collective_rpc``; ``request`` is JSON:
    ``{"cmd": "start", "out_dir", "run", "options", "seq_by_rid", "prompt_lens"}`` or ``{"cmd": "close",
    "seq_by_rid", "prompt_lens", "token_ids", "generated", "own_prompt_ids", "failure"}``. Raising reports the
    message back to the driver. The tracing state lives on the scheduler, which owns the model."""
    from sglang.srt.distributed import parallel_state

    msg = json.loads(request)
    cmd = msg.pop("cmd")
    if cmd == "start":
        if getattr(scheduler, _STATE, None) is not None:
            raise RuntimeError("tracing already started in this scheduler")
        setattr(scheduler, _STATE, start_on_runner(
            model_runner_of(scheduler), msg["out_dir"], msg["run"], msg.get("options"),
            seq_by_rid=msg["seq_by_rid"], prompt_lens=msg["prompt_lens"],
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            tp_size=parallel_state.get_tensor_model_parallel_world_size()))
    elif cmd == "close":
        tracing = getattr(scheduler, _STATE, None)
        if tracing is not None:
            setattr(scheduler, _STATE, None)
            close(tracing, **msg)
    else:
        raise ValueError(f"unknown {CONTROL_METHOD} command {cmd!r}")


@dataclass
class Tracing:
    """One traced model: its tracer, the ledger of the rows it ran, and how to undo the forward routing."""

    tracer: ModuleTracer
    ledger: RowLedger
    restore_forward: Callable[[], None]


def start_on_runner(model_runner: Any, out_dir: str, run: dict[str, Any], options: dict[str, str] | None = None,
                    *, seq_by_rid: dict[str, int], prompt_lens: list[int], tp_rank: int = 0, tp_size: int = 1
                    ) -> Tracing:
    """Attach a tracer to ``model_runner.model``; every later forward is one step. ``seq_by_rid`` says which
    sequence each request id the driver sends is. The index is rewritten after every step, rows and phases
    named, so if the engine dies the trace so far is on disk, readable and marked incomplete."""
    in_use = graph_runners_in_use(model_runner)
    if in_use:
        raise RuntimeError(f"SGLang replays CUDA graphs ({', '.join(in_use)}), where module hooks never fire; "
                           "Ekka passes disable_cuda_graph=True — this SGLang release needs another switch")
    model = model_runner.model
    directory = Path(out_dir) / f"rank-{tp_rank}" if tp_size > 1 else Path(out_dir)
    known = {f.name for f in fields(RunInfo)}
    info = RunInfo(**{k: v for k, v in run.items() if k in known})
    info.tp_rank, info.tp_size = tp_rank, tp_size
    info.declared = declared_weight_mapping(model)
    info.declared["tp_layout"] = tp_layout(model)
    writer = TraceWriter(directory, info)
    ledger = RowLedger()

    def layout(args: tuple, kwargs: dict) -> tuple[list[Any], list[int]]:
        if writer.steps:     # every recorded step is whole now: keep the trace on disk readable
            tracer.resolve_steps(lambda rid: seq_by_rid.get(str(rid), -1), prompt_lens)
            writer.checkpoint()
        lay = layout_of_call(args, kwargs)
        ledger.see(lay.reqs, lay.pos, kwargs.get("input_ids", args[0] if args else None), lay.problem)
        return lay.reqs, lay.pos

    restore_forward = route_forward_through_call(model)
    tracer = tracer_for(writer, layout, options).attach(model)
    return Tracing(tracer, ledger, restore_forward)


def close(tracing: Tracing, seq_by_rid: dict[str, int], prompt_lens: list[int], token_ids: list[list[int]],
          generated: list[list[int]], own_prompt_ids: list[list[int]], failure: str | None = None
          ) -> dict[str, Any]:
    """Detach, name every step's sequences and phases, prove the rows, write the index (complete only if proven)."""
    tracer = tracing.tracer
    tracer.detach()
    tracing.restore_forward()
    run = tracer.writer.run
    run.token_ids, run.prompt_lens, run.generated_ids = token_ids, prompt_lens, generated
    run.own_prompt_token_ids = own_prompt_ids
    tracer.resolve_steps(lambda rid: seq_by_rid.get(str(rid), -1), prompt_lens)
    problems = [failure] if failure else []
    if not tracer.fired:
        problems.append("no module hook fired: the model ran under CUDA graphs or torch.compile")
    if failure is None:    # a crashed run is incomplete anyway; its missing rows say nothing new
        problems += tracing.ledger.proof(seq_by_rid, token_ids)
    tracer.writer.close(complete=not problems, failure="; ".join(problems) or None)
    return {"calls": len(tracer.writer.calls), "steps": len(tracer.writer.steps), "fired": tracer.fired,
            "rank": run.tp_rank}
