"""A CPU stand-in for the parts of SGLang 0.5.23 that Ekka's SGLang runner touches, as read from its sources.

* ``ForwardMode`` / ``ForwardBatch`` with the fields Ekka reads (``forward_mode``, ``batch_size``, ``rids``,
  ``positions``, ``extend_seq_lens_cpu``, ``extend_prefix_lens_cpu``, ``req_pool_indices``, ``seq_lens``);
* ``LlamaForCausalLM``: a small SGLang-shaped model built from a HF Llama checkpoint (flat ``[tokens, hidden]``
  rows, a per-request KV cache, one rotary module shared by all layers, a logits processor that returns a
  dataclass with one row per request), called as SGLang's runners call it: ``model.forward(input_ids, positions,
  forward_batch)``, never ``model(...)``;
* a scheduler that batches like SGLang: every prompt in one EXTEND pass under a chunked-prefill token budget,
  prefill chunks mixed with running decodes (MIXED, as with ``enable_mixed_chunk``), then DECODE passes;
* ``Engine`` with ``run_scheduler_process_func`` (called once per "rank" in-process instead of in a spawned
  process), ``collective_rpc`` (flat scalar kwargs only, failures reported as an AssertionError, as in SGLang),
  ``generate(input_ids=…, rid=…, sampling_params=…)`` and ``tokenizer_manager.tokenizer`` / ``context_len``.

:func:`install` puts it in ``sys.modules`` as ``sglang`` (and the submodules Ekka imports).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

VERSION = "0.5.23+ekka-fake"


class ForwardMode(enum.IntEnum):
    EXTEND = enum.auto()
    DECODE = enum.auto()
    MIXED = enum.auto()
    IDLE = enum.auto()
    TARGET_VERIFY = enum.auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor
    rids: list[str] | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    token_to_kv_pool: dict = field(default_factory=dict, repr=False)   # (rid, layer) -> (K, V)

    def rows_per_request(self) -> list[int]:
        return [1] * self.batch_size if self.forward_mode == ForwardMode.DECODE else list(self.extend_seq_lens_cpu)


@dataclasses.dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor
    hidden_states: torch.Tensor | None = None


# -- the model ------------------------------------------------------------------------------------------------------
def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RotaryEmbedding(nn.Module):
    """SGLang's rotary module: ``(positions, q, k) -> (q, k)`` on flat rows, one instance shared by every layer."""

    def __init__(self, hf_rotary: nn.Module):
        super().__init__()
        self.hf_rotary = hf_rotary

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.hf_rotary(q, positions[None].long())        # [1, rows, head_dim]
        cos, sin = cos[0][:, None, :], sin[0][:, None, :]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class RadixAttention(nn.Module):
    """Attention of each request's new rows over its KV cache (the earlier rows of its sequence, then these)."""

    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.layer_id, self.num_heads, self.num_kv_heads, self.head_dim = layer_id, num_heads, num_kv_heads, head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        out, start = [], 0
        for rid, n in zip(forward_batch.rids, forward_batch.rows_per_request()):
            key = (rid, self.layer_id)
            old_k, old_v = forward_batch.token_to_kv_pool.get(key, (k[:0], v[:0]))
            keys, values = torch.cat([old_k, k[start:start + n]]), torch.cat([old_v, v[start:start + n]])
            forward_batch.token_to_kv_pool[key] = (keys, values)
            rep = self.num_heads // self.num_kv_heads
            kk, vv = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)   # [L, H, D]
            qq = q[start:start + n]                                                          # [n, H, D]
            scores = torch.einsum("nhd,lhd->hnl", qq, kk) / self.head_dim ** 0.5
            total = keys.shape[0]
            visible = torch.arange(total)[None, :] <= (torch.arange(n) + total - n)[:, None]
            scores = scores.masked_fill(~visible[None], float("-inf"))
            out.append(torch.einsum("hnl,lhd->nhd", scores.softmax(-1), vv).reshape(n, -1))
            start += n
        return torch.cat(out)


class LlamaAttention(nn.Module):
    def __init__(self, hf_attn: nn.Module, rotary: RotaryEmbedding, layer_id: int, cfg: Any):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj, hf_attn.o_proj
        self.rotary_emb = rotary
        self.head_dim = cfg.head_dim
        self.attn = RadixAttention(layer_id, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        n = hidden_states.shape[0]
        q = self.q_proj(hidden_states).view(n, -1, self.head_dim)
        k = self.k_proj(hidden_states).view(n, -1, self.head_dim)
        v = self.v_proj(hidden_states).view(n, -1, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, hf_layer: nn.Module, rotary: RotaryEmbedding, layer_id: int, cfg: Any):
        super().__init__()
        self.input_layernorm = hf_layer.input_layernorm
        self.self_attn = LlamaAttention(hf_layer.self_attn, rotary, layer_id, cfg)
        self.post_attention_layernorm = hf_layer.post_attention_layernorm
        self.mlp = hf_layer.mlp

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        h = hidden_states + self.self_attn(positions=positions, hidden_states=self.input_layernorm(hidden_states),
                                           forward_batch=forward_batch)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, hf_model: nn.Module, cfg: Any):
        super().__init__()
        rotary = RotaryEmbedding(hf_model.rotary_emb)
        self.embed_tokens = hf_model.embed_tokens
        self.layers = nn.ModuleList(LlamaDecoderLayer(layer, rotary, i, cfg) for i, layer in enumerate(hf_model.layers))
        self.norm = hf_model.norm

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(positions, h, forward_batch)
        return self.norm(h)


class LogitsProcessor(nn.Module):
    """Logits of each request's last row in the pass, computed from ``lm_head.weight`` (as SGLang does: the
    lm_head module itself is never called)."""

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor, lm_head: nn.Module,
                forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        last = torch.tensor(forward_batch.rows_per_request()).cumsum(0) - 1
        return LogitsProcessorOutput(next_token_logits=hidden_states[last] @ lm_head.weight.T)


class LlamaForCausalLM(nn.Module):
    def __init__(self, hf: nn.Module):
        super().__init__()
        cfg = hf.config
        cfg.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.model = LlamaModel(hf.model, cfg)
        self.lm_head = hf.lm_head
        self.logits_processor = LogitsProcessor()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
                ) -> LogitsProcessorOutput:
        hidden = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)


# -- runner, scheduler, engine --------------------------------------------------------------------------------------
class EagerRunner:
    """SGLang 0.5's stand-in for the prefill graph runner when graphs are off."""


class ModelRunner:
    def __init__(self, model: nn.Module):
        self.model = model
        self.decode_cuda_graph_runner = None
        self.prefill_cuda_graph_runner = EagerRunner()

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)   # as SGLang


@dataclass
class Req:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    slot: int
    prefilled: int = 0
    output: list[int] = field(default_factory=list)

    def token_at(self, p: int) -> int:
        return self.prompt[p] if p < len(self.prompt) else self.output[p - len(self.prompt)]

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


class Scheduler:
    def __init__(self, server_args: dict[str, Any], tp_rank: int = 0):
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(server_args["model_path"],
                                                  dtype=getattr(torch, server_args.get("dtype", "float32")))
        self.server_args, self.tp_rank = server_args, tp_rank
        self.tp_worker = SimpleNamespace(model_runner=ModelRunner(LlamaForCausalLM(hf).eval()))
        self.kv_pool: dict = {}
        self.forward_modes: list[str] = []

    def run_requests(self, prompts: list[list[int]], rids: list[str], max_new_tokens: int) -> list[Req]:
        """SGLang-like batching: prefill chunks under a token budget (mixed with running decodes when
        ``enable_mixed_chunk``), then decode passes, until every request has its tokens."""
        budget = int(self.server_args.get("chunked_prefill_size") or 8192)
        mixed = bool(self.server_args.get("enable_mixed_chunk"))
        reqs = [Req(r, list(p), max_new_tokens, slot=i + 1) for i, (r, p) in enumerate(zip(rids, prompts))]
        while not all(r.done for r in reqs):
            entries: list[tuple[Req, int, int]] = []   # (request, first position, rows)
            left = budget
            for r in reqs:
                if r.prefilled < len(r.prompt) and left > 0:
                    n = min(len(r.prompt) - r.prefilled, left)
                    entries.append((r, r.prefilled, n))
                    left -= n
            running = [r for r in reqs if r.prefilled == len(r.prompt) and not r.done]
            if entries:
                mode = ForwardMode.EXTEND
                if mixed and running:
                    mode = ForwardMode.MIXED
                    entries += [(r, len(r.prompt) + len(r.output) - 1, 1) for r in running]
            else:
                mode = ForwardMode.DECODE
                entries = [(r, len(r.prompt) + len(r.output) - 1, 1) for r in running]
            logits = self.tp_worker.model_runner.forward(self._batch(mode, entries)).next_token_logits
            self.forward_modes.append(mode.name)
            for (r, first, n), row in zip(entries, logits):
                if first + n <= len(r.prompt):
                    r.prefilled = first + n
                if first + n >= len(r.prompt):     # this pass computed the request's last fed token: sample
                    r.output.append(int(row.argmax()))
        return reqs

    def _batch(self, mode: ForwardMode, entries: list[tuple[Req, int, int]]) -> ForwardBatch:
        positions = [p for _, first, n in entries for p in range(first, first + n)]
        ids = [r.token_at(p) for r, first, n in entries for p in range(first, first + n)]
        extend = mode != ForwardMode.DECODE
        lens = [n for _, _, n in entries]
        prefix = [first for _, first, _ in entries]
        return ForwardBatch(
            forward_mode=mode, batch_size=len(entries), input_ids=torch.tensor(ids),
            req_pool_indices=torch.tensor([r.slot for r, _, _ in entries]),
            seq_lens=torch.tensor([first + n for _, first, n in entries]),
            positions=torch.tensor(positions, dtype=torch.int32), rids=[r.rid for r, _, _ in entries],
            extend_seq_lens=torch.tensor(lens) if extend else None,
            extend_prefix_lens=torch.tensor(prefix) if extend else None,
            extend_seq_lens_cpu=lens if extend else None, extend_prefix_lens_cpu=prefix if extend else None,
            token_to_kv_pool=self.kv_pool)


def run_scheduler_process(server_args: Any, port_args: Any, gpu_id: int, tp_rank: int, pp_rank: int,
                          dp_rank: Any, pipe_writer: list) -> None:
    """In SGLang this runs the scheduler's event loop in its own process; here it hands the scheduler back."""
    pipe_writer.append(Scheduler(server_args, tp_rank))


class Engine:
    run_scheduler_process_func = staticmethod(run_scheduler_process)
    instances: list["Engine"] = []

    def __init__(self, **kwargs: Any):
        from transformers import AutoConfig, AutoTokenizer

        self.server_args = kwargs
        self.schedulers: list[Scheduler] = []
        _RANK["size"] = int(kwargs.get("tp_size") or 1)
        for tp_rank in range(int(kwargs.get("tp_size") or 1)):   # one scheduler per tensor-parallel rank
            self.run_scheduler_process_func(kwargs, None, tp_rank, tp_rank, 0, None, self.schedulers)
        config = AutoConfig.from_pretrained(kwargs["model_path"])
        self.tokenizer_manager = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(kwargs["model_path"]),
                                                 context_len=int(kwargs.get("context_length")
                                                                 or config.max_position_embeddings))
        self.rpc_calls: list[tuple[str, dict]] = []
        self.shut_down = False
        Engine.instances.append(self)

    def collective_rpc(self, method: str, **kwargs: Any) -> None:
        # RpcReqInput.parameters: Dict[str, Union[bool, int, float, str, None]] (msgpack-validated in SGLang).
        assert all(isinstance(v, (bool, int, float, str, type(None))) for v in kwargs.values()), kwargs
        self.rpc_calls.append((method, kwargs))
        success, message = True, ""
        for s in self.schedulers:
            try:
                _RANK["current"] = s.tp_rank       # what parallel_state answers inside that scheduler
                getattr(s, method)(**kwargs)
            except Exception as e:  # noqa: BLE001 - SGLang reports any failure back as a message
                success, message = False, str(e)
        assert success, message

    def generate(self, prompt: Any = None, sampling_params: dict | None = None, input_ids: Any = None,
                 rid: Any = None, **_: Any) -> list[dict[str, Any]]:
        assert prompt is None and input_ids is not None and sampling_params["temperature"] == 0.0
        reqs = self.schedulers[0].run_requests(input_ids, rid, int(sampling_params["max_new_tokens"]))
        for s in self.schedulers[1:]:
            s.run_requests(input_ids, rid, int(sampling_params["max_new_tokens"]))
        return [{"text": "", "output_ids": list(r.output),
                 "meta_info": {"id": r.rid, "prompt_tokens": len(r.prompt), "completion_tokens": len(r.output)}}
                for r in reqs]

    def shutdown(self) -> None:
        self.shut_down = True


_RANK = {"current": 0, "size": 1}


def install(monkeypatch: Any) -> types.ModuleType:
    """Make ``import sglang`` (and the submodules Ekka's tracing imports) give this stand-in."""
    this = sys.modules[__name__]
    parallel_state = types.ModuleType("sglang.srt.distributed.parallel_state")
    parallel_state.get_tensor_model_parallel_rank = lambda: _RANK["current"]
    parallel_state.get_tensor_model_parallel_world_size = lambda: _RANK["size"]
    scheduler = types.ModuleType("sglang.srt.managers.scheduler")
    scheduler.Scheduler = Scheduler
    scheduler.run_scheduler_process = run_scheduler_process
    modules = {"sglang": types.ModuleType("sglang"), "sglang.srt": types.ModuleType("sglang.srt"),
               "sglang.srt.managers": types.ModuleType("sglang.srt.managers"),
               "sglang.srt.managers.scheduler": scheduler,
               "sglang.srt.distributed": types.ModuleType("sglang.srt.distributed"),
               "sglang.srt.distributed.parallel_state": parallel_state}
    modules["sglang"].Engine, modules["sglang"].__version__ = Engine, VERSION
    modules["sglang.srt.managers"].scheduler = scheduler
    modules["sglang.srt.distributed"].parallel_state = parallel_state
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    # Ekka's scheduler-process entry adds ekka_trace_control to the Scheduler class: removed again after the test.
    monkeypatch.setattr(Scheduler, "ekka_trace_control", None, raising=False)
    monkeypatch.setattr(Engine, "instances", [])
    return this
