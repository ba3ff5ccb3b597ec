"""Tensor-parallel unsharding: per-rank traces → one trace that looks as if one rank had run the model.

Every rank runs the same module calls in the same order. A module's output is either replicated (all-reduced:
row-parallel linears, norms, decoder layers — identical on every rank) or sharded along features. Fused column-
parallel modules (qkv, gate_up) shard *each block*, so rank r holds [q_r, k_r, v_r]: re-assembling needs the
block widths the engine declared (``tp_layout`` in the trace). Modules downstream of a column shard (attention,
gated activation) hold a contiguous slice and are concatenated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ekka_core.capture.trace import ModuleCall, TensorRef, Trace, TraceWriter
from ekka_core.contracts.errors import InternalFailure


def tp_layout(model: Any) -> dict[str, Any]:
    """How each module's output is split across tensor-parallel ranks, as the engine declares it (vLLM and SGLang
    name these attributes alike): a column-parallel linear without gather (``gather_output=False``) keeps a slice
    of every output block, and fused ones list their blocks' full widths in ``output_sizes`` (qkv: q, k, v — with
    the engine's own KV-head replication and value head size; gate_up: gate, up). Attention and gated activations
    inherit the column slice of their input."""
    out: dict[str, Any] = {}
    for name, m in model.named_modules():
        if getattr(m, "gather_output", True) is False:
            blocks = list(getattr(m, "output_sizes", None) or [m.output_size])
            out[name] = {"blocks": [int(b) for b in blocks]}
    return out


def unshard(rank_dirs: list[Path], out_dir: Path) -> Path:
    ranks = [Trace(d) for d in rank_dirs]
    base = ranks[0]
    for r in ranks[1:]:
        if [(c.module, c.step) for c in r.calls] != [(c.module, c.step) for c in base.calls]:
            raise InternalFailure(f"tensor-parallel ranks ran different module calls ({r.dir} vs {base.dir})")
    run = base.run
    layout = run.declared.get("tp_layout", {})
    run.tp_rank, run.declared = 0, {**run.declared, "unsharded_from": [str(d) for d in rank_dirs]}
    writer = TraceWriter(out_dir, run)
    writer.steps = base.steps
    for i, call in enumerate(base.calls):
        merged = ModuleCall(**{**call.__dict__, "inputs": [], "outputs": []})
        for port in ("inputs", "outputs"):
            refs = [getattr(r.calls[i], port) for r in ranks]
            out = []
            for j, ref in enumerate(refs[0]):
                if not isinstance(ref, TensorRef):
                    out.append(ref)
                    continue
                tensors = [r.tensor(rr[j]) for r, rr in zip(ranks, refs)]
                full = _merge(tensors, layout.get(call.module) if port == "outputs" and j == 0 else None)
                out.append(writer.add_tensor(f"c{i}.{'in' if port == 'inputs' else 'out'}{j}", full))
            setattr(merged, port, out)
        writer.calls.append(merged)
    writer.close(complete=all(r.run.complete for r in ranks),
                 failure=next((r.run.failure for r in ranks if r.run.failure), None))
    return out_dir


def _merge(tensors: list[torch.Tensor], layout: dict | None) -> torch.Tensor:
    if all(t.shape == tensors[0].shape and torch.equal(t, tensors[0]) for t in tensors[1:]):
        return tensors[0]                       # replicated (all-reduced) on every rank
    if layout and len(layout["blocks"]) > 1:
        tp = len(tensors)
        per_rank = [b // tp for b in layout["blocks"]]
        pieces = [t.split(per_rank, dim=-1) for t in tensors]
        return torch.cat([torch.cat([p[b] for p in pieces], dim=-1) for b in range(len(per_rank))], dim=-1)
    if tensors[0].dim() == 0 or any(t.shape[:-1] != tensors[0].shape[:-1] for t in tensors):
        return tensors[0]
    return torch.cat(tensors, dim=-1)
