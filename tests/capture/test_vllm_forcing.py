"""The logits processor that makes a traced vLLM run sample another run's tokens (ekka_core.capture.vllm_forcing),
driven by vLLM's own batch-update structures: which row carries which request as the persistent batch adds,
removes, moves and swaps them, and what each row may sample. The engine-level check (a real traced run sampling the
served run's tokens) is tests/capture/test_reference_beside.py."""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from ekka_core.capture.vllm_forcing import ForcedTokens
from ekka_core.capture.vllm_runner import FORCED_KEY


def _params(tokens: list[int] | None) -> SamplingParams:
    return SamplingParams(temperature=0.0, extra_args={FORCED_KEY: tokens} if tokens else None)


def _update(batch_size: int, added=(), removed=(), moved=()) -> BatchUpdate:
    return BatchUpdate(batch_size=batch_size, removed=list(removed), added=list(added), moved=list(moved))


def _picks(processor: ForcedTokens, rows: int, vocab: int = 16) -> list[int]:
    logits = torch.arange(rows * vocab, dtype=torch.float32).reshape(rows, vocab).flip(-1)  # unforced pick: 0
    return processor.apply(logits).argmax(-1).tolist()


def test_each_row_samples_its_requests_forced_token_for_the_step_it_is_at():
    processor = ForcedTokens(None, torch.device("cpu"), False)
    out_a, out_b, out_c = [], [], []
    processor.update_state(_update(3, added=[(0, _params([5, 6, 7]), [1, 2], out_a),
                                             (1, _params(None), [1], out_b),        # samples its own
                                             (2, _params([9]), [3], out_c)]))
    assert _picks(processor, 3) == [5, 0, 9]
    for out, token in ((out_a, 5), (out_b, 0), (out_c, 9)):
        out.append(token)                                   # vLLM appends each sampled token to the live list
    assert _picks(processor, 3) == [6, 0, 0]                # request c is past its forced tokens: its own choice


def test_rows_follow_their_requests_when_the_batch_removes_moves_and_swaps_them():
    processor = ForcedTokens(None, torch.device("cpu"), False)
    outs = [[], [], []]
    processor.update_state(_update(3, added=[(i, _params([10 + i, 20 + i]), [1], outs[i]) for i in range(3)]))
    # Request 0 finishes; its slot is filled by a new request; the last one is condensed into slot 1 after
    # request 1 finishes too.
    new: list[int] = []
    processor.update_state(_update(2, added=[(0, _params([13]), [1], new)], removed=[1],
                                   moved=[(2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    assert _picks(processor, 2) == [13, 12]
    processor.update_state(_update(2, moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert _picks(processor, 2) == [12, 13]
    processor.update_state(None)                            # no change this step
    assert _picks(processor, 2) == [12, 13]
    assert not processor.is_argmax_invariant()              # it must run under greedy decoding too
