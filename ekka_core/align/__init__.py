"""The align stage — alignment: put each mapped pair's tensors on the same rows and features, then prove it.

Entry point: :func:`align`. Every aligned tensor is ``[rows, features]`` in fp32 with one row per
(sequence, position) — the target's flat ``[num_tokens, …]`` batches (prefill and decode steps, several requests)
and the reference's ``[1, seq, …]`` teacher-forced passes both end up there.

A pair whose mapping carries an ``aligner`` (code the mapping agent wrote and validated) is aligned by that code,
run in a sandboxed subprocess (:mod:`ekka_core.align.custom`); a failing aligner fails only its pair.

Before anything is compared, :func:`prove_alignment` checks that the three traces describe the same computation:
same token ids, embeddings equal, and layer *i*'s output is layer *i+1*'s input inside each framework. A failed
proof stops the diagnosis with a message naming what did not line up — a wrong alignment would otherwise produce
a confident, wrong diagnosis.

Modules: :mod:`~ekka_core.align.traces` (the three traces, a row's key, :class:`AlignmentError`),
:mod:`~ekka_core.align.rows` (one endpoint's rows), :mod:`~ekka_core.align.proof` (:func:`prove_alignment`),
:mod:`~ekka_core.align.pairs` (:func:`align`, :func:`align_pair`, the aligned pairs); agent-written aligners:
:mod:`~ekka_core.align.template`, :mod:`~ekka_core.align.custom`, :mod:`~ekka_core.align.sandbox`.
"""

from __future__ import annotations

from ekka_core.align.pairs import (RELEASE_BYTES, AlignedPair, AlignedPairs, align, align_pair,
                                   ambiguous_routing)
from ekka_core.align.proof import prove_alignment
from ekka_core.align.rows import Rows, gather_rows, is_float, rows_of
from ekka_core.align.traces import AlignmentError, Key, Traces, positions_restricted

__all__ = ["AlignedPair", "AlignedPairs", "AlignmentError", "Key", "RELEASE_BYTES", "Rows", "Traces", "align",
           "align_pair", "ambiguous_routing", "gather_rows", "is_float", "positions_restricted", "prove_alignment",
           "rows_of"]
