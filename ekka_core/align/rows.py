"""Rows: one endpoint's tensors as a ``[rows, features]`` matrix, one row per (sequence, position) — flat engine
batches and ``[1, seq, …]`` reference batches alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ekka_core.align.traces import AlignmentError, Key
from ekka_core.capture.trace import ModuleCall, TensorRef, Trace, token_axis
from ekka_core.mapping import Endpoint


def _scaled(matrix: torch.Tensor, scale: float, dtype: str) -> torch.Tensor:
    """The constant the other side folds into its own module (Gemma's embedding normaliser), applied as the engine
    applies it in its parent's forward: in the run's dtype, the constant rounded to it, the product rounded once.
    Applied in fp32 instead, a correct engine would look a rounding away from the reference."""
    low = getattr(torch, dtype.removeprefix("torch."), torch.float32)
    return (matrix.to(low) * torch.tensor(scale, dtype=low)).float()


@dataclass
class Rows:
    """One endpoint's rows: a [rows, features] matrix and which (sequence, position) each row is."""

    index: dict[Key, int]
    matrix: torch.Tensor

    def take(self, keys: list[Key]) -> torch.Tensor:
        return self.matrix.index_select(0, torch.tensor([self.index[k] for k in keys], dtype=torch.long))


def rows_of(trace: Trace, ep: Endpoint) -> Rows:
    """Rows of one endpoint, keyed by (sequence, position); 1:N endpoints concatenated along features. Each call's
    tensor becomes one block of rows (one per token, or one per sequence for a call that holds only the sampled
    rows); blocks are concatenated once (a later call for the same key wins)."""
    parts: list[Rows] = []
    for module in ep.modules:
        keys_all: list[Key] = []
        blocks: list[torch.Tensor] = []
        for call in trace.calls_of(module):
            step = trace.steps[call.step]
            if ep.select == "all" and call.rows == "tokens":
                keys = list(zip(step.seq, step.pos))
                outs = [trace.tensor(r).float() for r in (call.outputs if ep.port == "output" else call.inputs)
                        if isinstance(r, TensorRef) and is_float(r)]
                flat = torch.cat([_token_rows(t, len(keys), call.module) for t in outs], dim=1)
            else:
                tensor = _select(trace, call, ep)
                if tensor is None:
                    continue
                if call.rows == "sampled":
                    last: dict[int, int] = {}
                    for s, p in zip(step.seq, step.pos):
                        if s >= 0:
                            last[s] = max(p, last.get(s, -1))
                    keys = list(last.items())
                    flat = tensor.reshape(tensor.shape[0], -1)
                else:
                    keys = list(zip(step.seq, step.pos))
                    flat = _token_rows(tensor, len(keys), call.module)
            keys_all.extend(keys)
            blocks.append(flat)
        if not blocks:
            parts.append(Rows({}, torch.empty(0, 0)))
            continue
        widths = sorted({b.shape[1] for b in blocks})
        if len(widths) != 1:
            raise AlignmentError(f"{module}: its {ep.port} rows have different widths across calls {widths}")
        index = {k: i for i, k in enumerate(keys_all) if k[0] >= 0}
        matrix = torch.cat(blocks)
        parts.append(Rows(index, _scaled(matrix, ep.scale, trace.run.dtype) if ep.scale is not None else matrix))
    if len(parts) == 1:
        return parts[0]
    common = sorted(set(parts[0].index).intersection(*(p.index for p in parts[1:])))
    if not common:
        return Rows({}, torch.empty(0, 0))
    return Rows({k: i for i, k in enumerate(common)}, torch.cat([p.take(common) for p in parts], dim=1))


def gather_rows(trace: Trace, ep: Endpoint) -> dict[Key, torch.Tensor]:
    """:func:`rows_of` as a dict (sequence, position) → row: what the agent's tools and the proofs read."""
    r = rows_of(trace, ep)
    return {k: r.matrix[i] for k, i in r.index.items()}


def _select(trace: Trace, call: ModuleCall, ep: Endpoint) -> torch.Tensor | None:
    refs = call.outputs if ep.port == "output" else call.inputs
    if ep.select.startswith("named:"):
        name = ep.select.split(":", 1)[1]
        if name not in call.output_names:
            return None
        ref = refs[call.output_names.index(name)]
        return trace.tensor(ref).float() if isinstance(ref, TensorRef) else None
    tensors = [r for r in refs if isinstance(r, TensorRef) and is_float(r)]
    if not tensors:
        return None
    first = trace.tensor(tensors[0]).float()
    if ep.minus_input is not None:
        added = [r for r in call.inputs if isinstance(r, TensorRef) and is_float(r)][ep.minus_input:][:1]
        if not added or added[0].shape != tensors[0].shape:
            raise AlignmentError(f"{call.module}: its input #{ep.minus_input}, which the mapping subtracts from its "
                                 "output (a residual added inside the block), is not there or not of its shape")
        first = first - trace.tensor(added[0]).float()
    if ep.select == "stream" and trace.stream_summed:
        # vLLM's residual stream travels as (hidden, residual): their sum is HF's single hidden state.
        for r in tensors[1:2]:
            if r.shape == tensors[0].shape:
                first = first + trace.tensor(r).float()
    return first


def is_float(ref: TensorRef) -> bool:
    """A floating-point tensor (activations); ids, masks and routing choices are not."""
    return ref.is_float


def _token_rows(t: torch.Tensor, n: int, module: str) -> torch.Tensor:
    """[n, …] (flat engine batch) or [1, …, n, …] (a reference batch of one) → [n, features]."""
    axis = token_axis(list(t.shape), n)
    if axis == 0:
        return t.reshape(n, -1)
    if axis is not None:
        # HF layouts put tokens second-to-last: [1, L, hidden] and, per head, [1, heads, L, head_dim].
        return t[0].movedim(axis - 1, 0).reshape(n, -1)
    raise AlignmentError(f"{module}: cannot find the token axis of a {list(t.shape)} tensor for {n} tokens")
