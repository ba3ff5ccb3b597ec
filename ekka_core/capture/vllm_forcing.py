"""Feeding a traced vLLM run the tokens an untraced run sampled.

A diagnosis traces the target after its served (untraced) run, and the reference runs beside the traced engine
teacher-forced on the *served* run's tokens. The traced baseline is another configuration (eager, no batching), so
where two tokens are nearly tied its greedy choice can differ from the served run's — on a random-weight 1B-shaped
Llama it does at the first sampled token — and the reference made beside it then traces other tokens than the
target fed: it had to run again after the engine (13 s of a 90 s diagnosis, measured).

:class:`ForcedTokens`, a vLLM v1 logits processor, makes the traced run sample what the untraced run sampled: at
each step of a request that carries its tokens (``SamplingParams.extra_args[FORCED_KEY]``) every logit but the
forced token's is set to −inf. It acts in the sampler, after the model: every module the hooks trace computes
exactly what it computes unforced, on the tokens the user saw; the engine's returned logprobs are the raw ones
(vLLM's default ``logprobs_mode``), taken before logits processors. Only the choice of the next token changes, and
that choice is the served run's. vLLM imports it by name (``vllm_runner.FORCED_PROCESSOR``) in the engine process.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ekka_core.capture.vllm_runner import FORCED_KEY


class ForcedTokens(LogitsProcessor):
    """Per batch row: the tokens to sample and the request's live output list (vLLM appends to it each step), so
    the step's forced token is ``forced[len(output)]``; past the end of ``forced`` the row samples as usual."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False                     # it changes what greedy decoding picks: it must run under greedy too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        # As vLLM's own sparse processors apply it (logits_processor.builtin.process_dict_updates): an added request
        # that fills a removed slot is not in `removed`. Older releases' tuples lack the prompt ids: the output list
        # is always the last item.
        for index, params, *rest in batch_update.added:
            forced = (params.extra_args or {}).get(FORCED_KEY) if params is not None else None
            if forced:
                self.rows[index] = (list(forced), rest[-1])
            else:
                self.rows.pop(index, None)
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if moved_a is not None:
                self.rows[b] = moved_a
            if direction == MoveDirectionality.SWAP and moved_b is not None:
                self.rows[a] = moved_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (forced, output) in self.rows.items():
            step = len(output)
            if step < len(forced) and row < logits.shape[0]:
                token = forced[step]
                logits[row].fill_(float("-inf"))
                logits[row, token] = 0.0
        return logits
