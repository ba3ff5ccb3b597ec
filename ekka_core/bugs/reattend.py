"""Attention injections for features of serving (prefix caching, chunked prefill, batching): which row of a step's
batch is which request, and a CPU attention backend that recomputes the rows a plan names wrongly."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from ekka_core.bugs.vllm_access import _vllm, vllm_compat

# Per engine step: what each row of the batch (the order the attention metadata uses) is. Written by the model
# runner wrapper after the persistent batch is final for the step, cleared when the step ends, so warm-up and
# profiling passes (which never go through execute_model) see nothing and stay untouched.
_STEP: dict[str, Any] = {}


@dataclass
class _Row:
    req_id: str
    computed: int           # tokens of this request already in the KV cache when the step starts
    prompt: int
    cache_hit: bool         # first scheduling, context served from the prefix cache (num_computed_tokens > 0)
    continuation: bool      # a prefill chunk after the first: its context is the request's own earlier chunks
    decode: bool


def _track_batch_rows() -> None:
    """Wrap the (CPU, GPU) model runner so attention injections can tell where each row's context comes from."""
    runner = _vllm("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    if getattr(runner, "_ekka_rows_tracked", False):
        return
    update_states = _vllm("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states")
    execute_model = runner.execute_model

    @functools.wraps(update_states)
    def _update_states(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        out = update_states(self, scheduler_output, *args, **kwargs)
        new = {r.req_id: int(r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs}
        batch = self.input_batch
        rows = []
        for i, req_id in enumerate(batch.req_ids):
            computed, prompt = int(batch.num_computed_tokens_cpu[i]), int(batch.num_prompt_tokens[i])
            rows.append(_Row(req_id, computed, prompt, cache_hit=new.get(req_id, 0) > 0,
                             continuation=req_id not in new and 0 < computed < prompt, decode=computed >= prompt))
        _STEP["rows"] = rows
        return out

    @functools.wraps(execute_model)
    def _execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return execute_model(self, *args, **kwargs)
        finally:
            _STEP.pop("rows", None)

    runner._update_states = _update_states
    runner.execute_model = _execute_model
    runner._ekka_rows_tracked = True


def _reattend(plan: Callable[[int, list[_Row], list[int], list[int]], dict[str, Any] | None]) -> None:
    """Make the CPU attention backend recompute some rows of a step wrongly.

    ``plan(i, rows, query_start_loc, seq_lens)`` returns None (row i is right) or how to get it wrong:
    ``{"seq_len": n}`` (attend as if the sequence were n long), ``{"block_row": j}`` (read row j's block table),
    ``{"own_tokens_only": True}`` (attend only to the keys computed in this step, as if the KV cache were empty).
    The correct kernel runs first for the whole batch; the planned rows are then recomputed with the same CPU
    kernel on the altered metadata and overwrite their output rows."""
    import torch

    _track_batch_rows()
    cpu_attn = _vllm("vllm.v1.attention.backends.cpu_attn")
    impl_cls = _vllm("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl")
    for name in ("cpu_attention_with_kv_cache", "cpu_attn_get_scheduler_metadata", "cpu_attn_reshape_and_cache"):
        _vllm("vllm._custom_ops", name)
    original = impl_cls.forward

    def forward(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, attn_metadata: Any,
                output: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        rows = _STEP.get("rows")
        if attn_metadata is None or not rows or getattr(self, "attn_type", "decoder") != "decoder":
            return result
        qsl = [int(v) for v in attn_metadata.query_start_loc.tolist()]
        seq_lens = [int(v) for v in attn_metadata.seq_lens.tolist()][:len(qsl) - 1]
        if len(qsl) - 1 != len(rows):
            return result
        for i in range(len(rows)):
            how = plan(i, rows, qsl, seq_lens)
            if how:
                _attend_row(self, layer, query, key, value, kv_cache, attn_metadata, output, qsl[i], qsl[i + 1],
                            seq_lens[i], i, how)
        return result

    def _attend_row(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, md: Any, output: Any,
                    q0: int, q1: int, seq_len: int, row: int, how: dict[str, Any]) -> None:
        ops = vllm_compat().custom_ops_module()
        envs = vllm_compat().envs_module()

        num_blocks, num_kv_heads, block_size, width = kv_cache.size()
        n = q1 - q0
        scales = {"k_scale": layer._k_scale_float, "v_scale": layer._v_scale_float,
                  "kv_cache_dtype": self.kv_cache_dtype}
        if how.get("own_tokens_only"):
            blocks = -(-n // block_size)
            cache = torch.zeros((blocks, num_kv_heads, block_size, width), dtype=kv_cache.dtype)
            k_cache, v_cache = cache.view((blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(key[q0:q1], value[q0:q1], k_cache, v_cache,
                                           torch.arange(n, dtype=md.slot_mapping.dtype), layer.isa, **scales)
            block_table = torch.arange(blocks, dtype=md.block_table.dtype).unsqueeze(0)
            seq_len = n
        else:
            k_cache, v_cache = kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)
            block_table = md.block_table[how.get("block_row", row)].unsqueeze(0).contiguous()
            seq_len = int(how.get("seq_len", seq_len))
        seq_lens = torch.tensor([seq_len], dtype=md.seq_lens.dtype)
        query_start_loc = torch.tensor([0, n], dtype=md.query_start_loc.dtype)
        scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=1, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_size,
            seq_lens=seq_lens, dtype=query.dtype, query_start_loc=query_start_loc, causal=True,
            sliding_window_size=self.sliding_window, isa=layer.isa, enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
            dynamic_causal=None, kv_cache_dtype=self.kv_cache_dtype)
        ops.cpu_attention_with_kv_cache(
            query=query[q0:q1], key_cache=k_cache, value_cache=v_cache, output=output[q0:q1],
            query_start_loc=query_start_loc, seq_lens=seq_lens, scale=self.scale, causal=True,
            alibi_slopes=self.alibi_slopes, sliding_window=self.sliding_window, block_table=block_table,
            softcap=self.logits_soft_cap, scheduler_metadata=scheduler_metadata, s_aux=self.sinks,
            dynamic_causal=None, **scales)

    impl_cls.forward = forward
    cpu_attn._ekka_reattend = True
