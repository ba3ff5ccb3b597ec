"""Forward hooks that record every module call of a model into a TraceWriter.

Framework-neutral: the runner that owns the model supplies ``layout``, called at the start of every forward step
with the root module's arguments, which returns which (request, position) each row of that step belongs to.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import torch
from torch import nn

from ekka_core.capture.trace import ModuleCall, Step, TensorRef, TraceWriter, token_axis
from ekka_core.contracts.spec import PositionRanges, in_positions, parse_positions

# HF passes these as keyword arguments to every layer; they are bookkeeping, not activations of the module.
_SKIPPED_KWARGS = {"attention_mask", "past_key_values", "past_key_value", "position_embeddings", "cache_position",
                   "position_ids", "use_cache", "output_attentions", "kwargs", "logits_to_keep"}

# (request ids per row, positions per row); request ids are whatever the runner uses, resolved to
# sequence indices when the trace is closed.
Layout = tuple[list[Any], list[int]]


# Class → (name, qualname, class file, line, forward file, line): inspect re-reads source files, so once per process.
_CLASS_INFO: dict[type, tuple] = {}
_FUNCTION_SOURCE: dict[Any, tuple[str | None, int | None]] = {}


def _checksum(t: torch.Tensor) -> float:
    """What tells an in-place change of a recorded tensor: its sum in float32. A float32 tensor is summed as it is;
    any other on the CPU is converted block by block through one reused float32 buffer — converting a [306, 16384]
    bf16 tensor whole allocated (and page-faulted) 20 MB per call: 2.1 ms against 0.9 ms, one thread, measured. The
    same tensor always gives the same sum, which is all a comparison of two checksums needs."""
    t = t.detach()
    if t.dtype == torch.float32:
        return float(t.sum())
    if t.device.type != "cpu":           # where the tensor lives: an accelerator converts it whole, fast
        return float(t.float().sum())
    flat = t.reshape(-1)
    total = 0.0
    for start in range(0, flat.numel(), _CHECKSUM_BLOCK.numel()):
        chunk = flat[start:start + _CHECKSUM_BLOCK.numel()]
        block = _CHECKSUM_BLOCK[:chunk.numel()]
        block.copy_(chunk)
        total += float(block.sum())
    return total


# The float32 block :func:`_checksum` converts through (4 MB: stays in cache between the copy and the sum).
_CHECKSUM_BLOCK = torch.empty(1 << 20, dtype=torch.float32)


def _source(obj: Any) -> tuple[str | None, int | None]:
    try:
        return inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1]
    except (TypeError, OSError):
        return None, None


def _class_info(cls: type) -> tuple:
    """(name, qualname, class file, line, forward file, line), read once per class per process."""
    info = _CLASS_INFO.get(cls)
    if info is None:
        cf, cl = _source(cls)
        ff, fl = _source(cls.forward)
        info = (cls.__name__, f"{cls.__module__}.{cls.__qualname__}", cf, cl, ff, fl)
        _CLASS_INFO[cls] = info
    return info


def tracer_for(writer: TraceWriter, layout: Callable[[tuple, dict], Layout], options: dict[str, str] | None,
               *, reference: bool = False) -> "ModuleTracer":
    """A tracer configured by a spec's trace options (module regex, storage dtype, token positions); the options
    are recorded in the trace so that a restricted trace says so. ``reference``: the reference's run, which stores a
    parameter-free leaf's output only where a module receives it (:class:`ModuleTracer`)."""
    import re

    options = {k: v for k, v in (options or {}).items() if v}
    writer.run.trace_options = dict(options)
    if options.get("store_dtype"):
        writer.store_dtype = getattr(torch, options["store_dtype"])
    pattern = re.compile(options["include"]) if options.get("include") else None
    positions = parse_positions(options["positions"]) if options.get("positions") else None
    return ModuleTracer(writer, layout, include=(lambda name: bool(pattern.search(name))) if pattern else None,
                        positions=positions, free_outputs_when_received=reference)


def weight_owners(root: nn.Module, sums: dict[str, list[float]] | None = None
                  ) -> tuple[dict[str, list[str]], dict[str, list[float]]]:
    """For every module of ``root``: the modules owning the parameters it computes with (its subtree's, however
    they are reached), each parameter under the module that registered it first — so a module that holds a
    borrowed parameter (vLLM's shared expert calls the block's ``shared_expert_gate``) lists that owner too. And for
    every owner, :func:`weight_sums` of its own parameters: what lets the mapping tell "the same weights" by value
    where the two frameworks name them differently. ``sums`` already taken (at load, by Ekka's vLLM plugin) are
    returned as they are, not computed again."""
    owner: dict[int, str] = {}
    taken = sums is not None
    sums = dict(sums or {})
    for name, module in root.named_modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in owner]
        for p in own:
            owner[id(p)] = name
        if own and not taken:
            sums[name] = weight_sums(own)
    owners = {name: sorted({owner[id(p)] for p in module.parameters() if id(p) in owner})
              for name, module in root.named_modules()}
    return owners, sums


def weight_sums(params: list[torch.Tensor]) -> list[float]:
    """(Σw, Σw², Σ(i+j)·w, span) over the values, rounded to bfloat16 and summed in float64.

    The first two are unchanged by what engines do to weights when they load them — concatenating (qkv), stacking
    (experts), transposing, padding with zeros (vocabulary) — and by the precision each side holds them in
    (bf16-rounded values of an fp32 and a bf16 copy are the same). The third weighs each value by the sum of its
    indices: unchanged by a transpose or by zero rows appended, changed when the engine puts the same values in
    another order (BLOOM's fused qkv, regrouped from per-head to [q|k|v] when vLLM loads it, whose output features
    then come in another order); ``span`` (Σ of the parameters' dimensions) scales its tolerance. The last two are
    left out for an owner with a parameter of more than two dimensions (stacked experts), whose order is the
    engine's own business."""
    s1 = s2 = order = 0.0
    span, ordered = 0, True
    blocks = _SumBlocks()
    with torch.no_grad():
        for p in params:
            p = p.detach()
            if p.dim() > 2:
                ordered = False
            if p.numel():
                m = p.reshape(p.shape[0], -1) if p.dim() else p.reshape(1, 1)
                rows, cols = m.shape
                col_sums = torch.zeros(cols, dtype=torch.float64)
                step = max(1, _SUM_BLOCK // cols)
                for start in range(0, rows, step):
                    x = blocks.float64_of(m[start:start + step])
                    row_sums = x.sum(dim=1)
                    s1 += float(row_sums.sum())
                    flat = x.reshape(-1)
                    s2 += float(torch.dot(flat, flat))
                    if ordered and p.dim():     # Σ_i i·(row sum i) + Σ_j j·(column sum j)
                        row_index = torch.arange(start, start + x.shape[0], dtype=torch.float64)
                        order += float(torch.dot(row_sums, row_index))
                        col_sums += x.sum(dim=0)
                if ordered and p.dim():
                    order += float(torch.dot(col_sums, torch.arange(cols, dtype=torch.float64)))
            span += sum(p.shape)
    return [s1, s2, order, float(span)] if ordered else [s1, s2]


# Values per block that :func:`weight_sums` converts at once: 8 MB in float64, which stays in cache for the three
# reductions that read it. Both blocks are allocated once and reused: a fresh 32 MB float64 copy per block (as
# before) paid its page faults every time and summed a 1B-shaped model at 4.0 s per 10⁹ values on one thread, these
# at 0.5 s (same sums to 1e-15; measured on [8192, 2048], [2048, 8192] and [32000, 2048] bf16 tensors).
_SUM_BLOCK = 1 << 20


class _SumBlocks:
    """The reused bf16 and float64 blocks :func:`weight_sums` rounds and widens a block of values through."""

    def __init__(self) -> None:
        self._bf16 = torch.empty(0, dtype=torch.bfloat16)
        self._f64 = torch.empty(0, dtype=torch.float64)

    def float64_of(self, block: torch.Tensor) -> torch.Tensor:
        """``block`` rounded to bfloat16 (round to nearest even, as ``.to(bfloat16)``), in float64, in a reused
        buffer: valid until the next call."""
        n = block.numel()
        if self._f64.numel() < n:
            self._bf16, self._f64 = torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.float64)
        if block.dtype != torch.bfloat16:
            rounded = self._bf16[:n].view(block.shape)
            rounded.copy_(block)
            block = rounded
        out = self._f64[:n].view(block.shape)
        out.copy_(block)
        return out


def kept_rows(reqs: list[Any], pos: list[int], positions: PositionRanges) -> list[int]:
    """Rows of one step to record under a positions restriction: those at a position in the set, plus — when any
    is — each request's last row in the step, where the engine samples (the logits are one row per request, and
    the aligner keys them by that last position). A step with no position in the set records nothing."""
    keep = {i for i, p in enumerate(pos) if in_positions(positions, p)}
    if not keep:
        return []
    last = {r: i for i, r in enumerate(reqs) if r is not None}
    return sorted(keep | set(last.values()))


class _StepAtForward:
    """A removable wrapper of one module instance's ``forward`` calling ``start(module, args, kwargs)`` first: a
    forward pre-hook for a module whose class bypasses ``nn.Module.__call__``."""

    def __init__(self, module: nn.Module, start: Callable[[nn.Module, tuple, dict], Any]):
        self.module, self.original = module, module.forward
        self._own = "forward" in module.__dict__      # an instance forward already there (an injected bug's)

        def forward(*args: Any, **kwargs: Any) -> Any:
            start(module, args, kwargs)
            return self.original(*args, **kwargs)

        module.forward = forward

    def remove(self) -> None:
        if self._own:
            self.module.forward = self.original
        else:
            del self.module.forward


class ModuleTracer:
    """Install with :meth:`attach`; every forward of the root starts a new step.

    ``free_outputs_when_received`` (the reference's runs): the output of a leaf module without parameters — an
    activation — is stored only once a module receives it, under the producer's call. HF's gated MLPs compute
    ``act_fn(gate) * up`` in the MLP's forward: the activation's output reaches no module, and no engine computes it
    alone (vLLM and SGLang fuse it into ``SiluAndMul``, which pairs with ``down_proj``'s input), so it was stored
    twice per layer — 15 % of each reference trace of a 1B-shaped Llama — and never read. A plain activation's output
    (``fc2(act(fc1(x)))``) is received, so stored, and pairs as before. Not stored, the output is said so in the call
    (the mapping then finds its widths unobserved and leaves such a pair unmapped, with that reason)."""

    def __init__(self, writer: TraceWriter, layout: Callable[[tuple, dict], Layout],
                 *, include: Callable[[str], bool] | None = None, positions: PositionRanges | None = None,
                 free_outputs_when_received: bool = False):
        self.writer = writer
        self.free_outputs_when_received = free_outputs_when_received
        self._free_leaves: set[int] = set()      # ids of the leaf modules without parameters
        # Their outputs this step not yet received by a module: tensor id -> (call, output index, tensor, checksum)
        self._unreceived: dict[int, tuple[ModuleCall, int, torch.Tensor, float]] = {}
        self.layout = layout
        self.include = include or (lambda name: True)
        self.positions = positions
        # This step under a positions restriction: skipped entirely, or the rows kept out of how many.
        self._skip_step = False
        self._rows: torch.Tensor | None = None
        self._step_rows = 0
        self.skipped_steps = 0
        self.handles: list[Any] = []
        self._step_req: list[list[Any]] = []   # raw request ids per step (resolved at close)
        self._names: dict[int, str] = {}
        self._child_attr: dict[tuple[int, int], str] = {}   # (parent id, child id) -> attribute name
        self._stack: list[str] = []                          # paths of the modules executing right now
        self._parent_ids: list[int] = []
        # This step's outputs with their checksum at hook time, for _check_mutations. Held until the step ends (on
        # a GPU this keeps the step's activations alive): a tensor changed in place after its hook — the trust
        # check — can only be seen while it exists.
        self._live: list[tuple[ModuleCall, torch.Tensor, float]] = []
        # Inputs are cloned when the module is entered (a fused kernel may overwrite them in place before the
        # forward hook runs); one list per executing module, matched to its call when it completes.
        self._inputs: list[list[TensorRef | str | None] | None] = []
        # This step's stored outputs by tensor identity: an input that *is* an earlier output, unchanged (same
        # checksum, computed where the tensor lives), reuses its stored copy instead of writing the same bytes again
        # (most inputs are the previous module's output).
        self._seen: dict[int, tuple[TensorRef, torch.Tensor, float]] = {}
        # The same stored outputs by their storage, where they are contiguous: an input that is a *view* of one
        # (HF's rotary inputs, q and k transposed out of q_proj/k_proj's outputs; vLLM's, q and k split out of
        # qkv_proj's), unchanged since, is stored as that view of its stored copy rather than as a copy of its own.
        self._bases: dict[int, list[tuple[TensorRef, torch.Tensor, float]]] = {}
        self._entries = 0
        # For each executing module (by depth in _inputs): the index of the last call completed when it was entered —
        # when its input was observed, on the same clock as the calls' completion order.
        self._entered: dict[int, int] = {}
        self.fired = 0

    # -- installation -----------------------------------------------------------------------------------------
    def attach(self, root: nn.Module) -> "ModuleTracer":
        if type(root).__call__ is nn.Module.__call__:
            self.handles.append(root.register_forward_pre_hook(self._start_step, with_kwargs=True))
        else:
            # vLLM's compile decorator on the top-level class (ERNIE 4.5's Ernie4_5ForCausalLM) replaces __call__
            # with its own, which calls forward directly: the root's hooks never fire. Its forward starts the step.
            self.handles.append(_StepAtForward(root, self._start_step))
        # named_modules() de-duplicates: a module shared by several parents (vLLM's rotary_emb) keeps the first
        # name, and all its calls are recorded under it.
        for name, module in root.named_modules():
            self._names[id(module)] = name
            # Every module's class, hooked calls or not (vLLM's compile decorator bypasses a model's own hooks):
            # a parent whose forward never fires a hook can still own the code that runs between two children.
            self.writer.run.module_classes[name] = list(_class_info(type(module)))
            for attr, child in module.named_children():
                self._child_attr[(id(module), id(child))] = attr
            self.handles.append(module.register_forward_pre_hook(self._enter, with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._record, with_kwargs=True))
            if (self.free_outputs_when_received and next(module.children(), None) is None
                    and next(module.parameters(recurse=False), None) is None):
                self._free_leaves.add(id(module))
        # Sums taken when the engine loaded the weights, where its plugin kept them (before any repacking).
        self.writer.run.module_weights, self.writer.run.weight_sums = weight_owners(
            root, getattr(root, "_ekka_weight_sums", None))
        return self

    def _path(self, module: nn.Module) -> str:
        """Where this call happens. A shared module (vLLM reuses one rotary_emb, one act_fn) is named after its
        call site — the parent executing it — not after the first parent it was registered under."""
        if self._stack:
            parent = self._stack[-1]
            attr = self._child_attr.get((self._parent_ids[-1], id(module)))
            if attr is not None:
                return f"{parent}.{attr}" if parent else attr
        return self._names[id(module)]

    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        path = self._path(module)
        self._stack.append(path)
        self._parent_ids.append(id(module))
        if not self._recording() or not self.include(path):
            self._inputs.append(None)
            return
        self._entries += 1
        inputs: list[Any] = list(args) + [v for k, v in kwargs.items() if k not in _SKIPPED_KWARGS]
        self._inputs.append([self._store_input(f"e{self._entries}.in{i}", x, path)
                             for i, x in enumerate(_flatten(inputs))])
        self._entered[len(self._inputs) - 1] = len(self.writer.calls) - 1

    def _store_input(self, key: str, x: Any, module: str) -> TensorRef | str | None:
        if isinstance(x, torch.Tensor):
            if id(x) in self._unreceived:
                received = self._store_received(x)
                if received is not None:
                    return received
            seen = self._seen.get(id(x))
            if seen is not None and seen[1] is x and _checksum(x) == seen[2]:
                return seen[0]
            view = self._view_of_stored(x)
            if view is not None:
                return view
        return self._store(key, x, module)

    def _store_received(self, x: torch.Tensor) -> TensorRef | None:
        """A parameter-free leaf's output a module now receives, unchanged: stored as the producer's output (its key,
        its module) and shared with this input. None where it changed since (the input is stored as received)."""
        call, i, produced, checksum = self._unreceived.pop(id(x))
        if produced is not x or _checksum(x) != checksum:
            return None
        ref = self._store(f"c{call.index}.out{i}", x, call.module)
        if not isinstance(ref, TensorRef):
            return None
        call.outputs[i] = ref
        self._remember(call, x, ref, checksum)
        return ref

    def _remember(self, call: ModuleCall, x: torch.Tensor, ref: TensorRef, checksum: float) -> None:
        """A stored output: watched for in-place changes, and shared with the inputs that are it or a view of it."""
        if x.is_floating_point():
            self._live.append((call, x, checksum))
        self._seen[id(x)] = (ref, x, checksum)
        if self._rows is None and x.layout == torch.strided and x.is_contiguous():
            self._bases.setdefault(x.untyped_storage().data_ptr(), []).append((ref, x, checksum))

    def _view_of_stored(self, x: torch.Tensor) -> TensorRef | None:
        """``x`` as a view of a stored contiguous output it lies within, that output unchanged since it was stored
        (None: none is)."""
        if self._rows is not None or x.layout != torch.strided or x.numel() == 0 or min(x.stride(), default=0) < 0:
            return None
        for ref, base, checksum in self._bases.get(x.untyped_storage().data_ptr(), ()):
            offset = x.storage_offset() - base.storage_offset()
            last = offset + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
            if base.dtype == x.dtype and 0 <= offset and last < base.numel() and _checksum(base) == checksum:
                return dataclasses.replace(ref, shape=list(x.shape), delta_over=None, codec=None,
                                           view=[offset, list(x.stride())])
        return None

    def _recording(self) -> bool:
        """Inside a traced step (not warm-up before the first, not a step the positions restriction skips)."""
        return bool(self.writer.steps) and not self._skip_step

    def _attention_map(self, x: Any) -> bool:
        """A [batch, heads, tokens, tokens] float tensor beside a module's first output: the attention
        probabilities HF's eager attention returns. No engine materialises them (paged and flash attention never
        do), so no mapping pairs them; quadratic in the tokens, they were the largest part of a long prompt's
        reference trace."""
        return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 4
                and x.shape[-1] == x.shape[-2] == self._step_rows)

    def _restrict(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of ``x`` this step keeps under a positions restriction (its token axis sliced)."""
        if self._rows is None:
            return x
        axis = token_axis(list(x.shape), self._step_rows)
        return x if axis is None else x.index_select(axis, self._rows.to(x.device))

    def detach(self) -> None:
        self._check_mutations()
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _check_mutations(self) -> None:
        """Flag outputs that changed after their hook ran (fused kernels update tensors in place: vLLM's add+RMSNorm
        rewrites the residual). The recorded value is the clone taken at hook time — the module's true output —
        so the trace stays valid; the flag says downstream consumers saw something else."""
        now: dict[int, float] = {}      # one sum per tensor, however many calls returned it
        for call, live, checksum in self._live:
            if id(live) not in now:
                now[id(live)] = _checksum(live)
            if now[id(live)] != checksum and checksum == checksum:
                call.mutated_after_hook = True
        self._live.clear()
        self._seen.clear()
        self._bases.clear()
        self._unreceived.clear()

    # -- hooks ------------------------------------------------------------------------------------------------
    def _start_step(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._check_mutations()
        reqs, pos = self.layout(args, kwargs)
        self._skip_step, self._rows, self._step_rows = False, None, len(pos)
        if self.positions is not None:
            keep = kept_rows(reqs, pos, self.positions)
            if not keep:
                self._skip_step = True
                self.skipped_steps += 1
                return
            if len(keep) < len(pos):
                self._rows = torch.tensor(keep, dtype=torch.long)
                reqs, pos = [reqs[i] for i in keep], [pos[i] for i in keep]
        step = Step(index=len(self.writer.steps), phase="", seq=[], pos=list(pos))
        self.writer.steps.append(step)
        self._step_req.append(list(reqs))

    def _record(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        path = self._stack.pop() if self._stack else self._names[id(module)]
        if self._parent_ids:
            self._parent_ids.pop()
        entered_after = self._entered.pop(len(self._inputs) - 1, None)
        stored_inputs = self._inputs.pop() if self._inputs else None
        if not self._recording() or not self.include(path) or stored_inputs is None:
            return  # outside any traced step (warm-up, skipped positions), or excluded by the module filter
        self.fired += 1
        w = self.writer
        step = w.steps[-1]
        index = len(w.calls)
        info = _class_info(type(module))
        call = ModuleCall(index=index, step=step.index, module=path, cls=info[0],
                          qualname=info[1], class_file=info[2], class_line=info[3], forward_file=info[4],
                          forward_line=info[5])
        if path != self._names[id(module)]:
            call.shared_as = self._names[id(module)]

        call.inputs = stored_inputs
        call.entered_after = entered_after
        names, values = _flatten_output(output)
        call.output_names = names
        call.outputs = []
        for i, x in enumerate(values):
            if i > 0 and self._attention_map(x):
                call.outputs.append(f"attention probabilities {list(x.shape)}: not stored")
                continue
            if isinstance(x, torch.Tensor) and id(x) in self._unreceived:
                self._store_received(x)          # a parent returning its activation child's output receives it
            seen = self._seen.get(id(x)) if isinstance(x, torch.Tensor) else None
            checksum = _checksum(x) if seen is not None and seen[1] is x else None
            if seen is not None and checksum == seen[2]:
                # A parent returning its last child's output (HF's LlamaMLP returns down_proj's): that one copy.
                call.outputs.append(seen[0])
                if x.is_floating_point():
                    self._live.append((call, x, checksum))
                continue
            if id(module) in self._free_leaves and isinstance(x, torch.Tensor) and x.is_floating_point():
                self._unreceived[id(x)] = (call, len(call.outputs), x, _checksum(x) if checksum is None else checksum)
                call.outputs.append(f"{list(x.shape)}: not stored — a parameter-free module's output no module "
                                    "received")
                continue
            ref = self._store(f"c{index}.out{i}", x, path)
            call.outputs.append(ref)
            if isinstance(x, torch.Tensor) and isinstance(ref, TensorRef):
                self._remember(call, x, ref, _checksum(x) if checksum is None else checksum)
        first = next((o for o in call.outputs if isinstance(o, TensorRef)), None)
        n_rows, n_reqs = len(step.pos), len(set(self._step_req[-1]))
        if (first is not None and first.shape and first.shape[0] != n_rows and first.shape[0] == n_reqs
                and n_rows not in first.shape[1:]):  # [1, L, …] / [1, heads, L, d] is a batch of one
            call.rows = "sampled"  # e.g. vLLM's LogitsProcessor: one row per request, its last token
        w.calls.append(call)

    def record_function(self, name: str, fn: Any, args: tuple, output: Any) -> None:
        """Record a plain function call (HF's ``apply_rotary_pos_emb``) as a pseudo-module under its caller:
        the reference computes some components with functions, and they must be comparable too."""
        path = f"{self._stack[-1]}.{name}" if self._stack else ""
        if not self._recording() or not path or not self.include(path):
            return
        step = self.writer.steps[-1]
        index = len(self.writer.calls)
        if fn not in _FUNCTION_SOURCE:
            _FUNCTION_SOURCE[fn] = _source(fn)
        ff, fl = _FUNCTION_SOURCE[fn]
        call = ModuleCall(index=index, step=step.index, module=path, cls="function",
                          qualname=f"{fn.__module__}.{fn.__qualname__}", class_file=ff, class_line=fl,
                          forward_file=ff, forward_line=fl)
        call.inputs = [self._store_input(f"c{index}.in{i}", x, path) for i, x in enumerate(_flatten(list(args)))]
        names, values = _flatten_output(output)
        call.outputs = [self._store(f"c{index}.out{i}", x, path) for i, x in enumerate(values)]
        self.fired += 1
        self.writer.calls.append(call)

    def _store(self, key: str, x: Any, module: str) -> TensorRef | str | None:
        if x is None:
            return None
        if isinstance(x, torch.Tensor):
            return self.writer.add_tensor(key, self._restrict(x), module)
        return _summary(x)

    def keep_raw_requests(self) -> None:
        """Steps whose request ids were never resolved to sequences keep the engine's raw ids."""
        for step, reqs in zip(self.writer.steps, self._step_req):
            if not step.seq:
                step.req = [None if r is None else str(r) for r in reqs]

    # -- closing ----------------------------------------------------------------------------------------------
    def resolve_steps(self, seq_of: Callable[[Any], int], prompt_lens: list[int]) -> None:
        """Turn raw request ids into sequence indices and name each step's phase from prompt lengths: ``prefill``
        while every row is in its prompt, else ``decode:k`` where k is the generated token being processed
        (position − prompt length + 1, as the analysis names an onset) — right even when steps were skipped."""
        for step, reqs in zip(self.writer.steps, self._step_req):
            step.seq = [seq_of(r) if r is not None else -1 for r in reqs]
            step.req = None
            decoding = [p - prompt_lens[s] + 1 for s, p in zip(step.seq, step.pos) if s >= 0 and p >= prompt_lens[s]]
            step.phase = f"decode:{max(decoding)}" if decoding else "prefill"


def _flatten(xs: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in xs:
        if isinstance(x, (tuple, list)) and all(isinstance(y, (torch.Tensor, type(None))) for y in x):
            out.extend(x)
        else:
            out.append(x)
    return out


def _flatten_output(output: Any) -> tuple[list[str], list[Any]]:
    if isinstance(output, dict):  # HF ModelOutput is a dict subclass
        names = [k for k, v in output.items() if isinstance(v, torch.Tensor)]
        return names, [output[k] for k in names]
    if isinstance(output, (tuple, list)):
        return [], _flatten(list(output))
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        # SGLang's LogitsProcessorOutput: the logits are its first tensor field (next_token_logits).
        names = [f.name for f in dataclasses.fields(output) if isinstance(getattr(output, f.name), torch.Tensor)]
        return names, [getattr(output, n) for n in names]
    return [], [output]


def _summary(x: Any) -> str:
    if isinstance(x, (int, float, bool, str)):
        return repr(x)[:80]
    return type(x).__name__
