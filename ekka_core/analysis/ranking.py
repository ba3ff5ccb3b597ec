"""The analysis stage's entry point: aligned pairs in, a :class:`~ekka_core.contracts.ranking.Ranking` out.

Per-pair error ratios (:mod:`~ekka_core.analysis.ratios`), observed on one clock and searched for the first
sustained shift (:mod:`~ekka_core.analysis.observations`), ranked where the error was introduced
(:mod:`~ekka_core.analysis.suspects`); departures from the reference's own rounding convention are reported beside
them (:mod:`~ekka_core.analysis.conventions`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ekka_core.align import AlignedPairs
from ekka_core.analysis.conventions import _conventions
from ekka_core.analysis.observations import _first_sustained_shift, _observations
from ekka_core.analysis.ratios import _pair_result
from ekka_core.analysis.suspects import GlueLocator, _rank
from ekka_core.contracts.alignment import TIED_OUT
from ekka_core.contracts.ranking import PairResult, Ranking, finite_ratio
from ekka_core.contracts.report import Unchecked


def analyse(aligned: AlignedPairs, *, threshold: float, dtype: str, target_classes: dict[str, dict[str, Any]],
            prompt_lens: list[int], unchecked: list[dict[str, str]] | None = None,
            entered: dict[str, int | None] | None = None, locate: GlueLocator | None = None) -> Ranking:
    """``target_classes``: module path → {cls, file, line, forward_file, forward_line} for every module of the
    target (traced or not: a parent whose hooks never fire can still own the code between two children);
    ``entered``: module path → ``entered_after`` of its first call; ``locate``: see :data:`GlueLocator`."""
    results: list[PairResult] = []
    for ap in aligned:
        pr = _pair_result(ap, dtype, target_classes)
        pr.entered_after = (entered or {}).get(pr.component)
        results.append(pr)
    ranking = Ranking(verdict="consistent", threshold=threshold, dtype=dtype, pairs=results,
                      unchecked=list(unchecked or []), prompt_lens=prompt_lens)
    ranking.unchecked += [f.unchecked() for f in aligned.failures]
    ranking.unchecked += [Unchecked(c, TIED_OUT) for c in aligned.tied_out]
    ranking.notes.append("post-logits sampling (temperature, top-p, penalties) is outside per-module comparison")
    if not results:
        ranking.notes.append("no mapped pair could be compared")
        return ranking
    observations = _observations(results)
    ranking.conventions = _conventions(results, observations, target_classes, dtype, locate)
    log_r = np.log10(np.array([max(finite_ratio(o.ratio), 1e-6) for o in observations]))
    start = _first_sustained_shift(log_r, math.log10(threshold))
    if start is None:
        above = sorted({results[o.pair].component for o in observations if o.ratio > threshold})
        if above:
            ranking.notes.append(f"isolated ratios above {threshold} that do not persist downstream "
                                 f"(treated as noise): {', '.join(above[:5])}")
        return ranking
    ranking.verdict = "divergent"
    ranking.suspects = _rank(results, observations, start, threshold, target_classes, prompt_lens, locate)
    first = observations[start]
    ranking.change_point = first.pair
    return ranking
