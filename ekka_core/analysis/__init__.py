"""The analysis stage: error ratios, the first sustained divergence, where it was introduced, ranked suspects.

Entry point: :func:`analyse` (:mod:`~ekka_core.analysis.ranking`). The method, module by module:
:mod:`~ekka_core.analysis.ratios` (the error ratio), :mod:`~ekka_core.analysis.observations` (one clock, the first
sustained shift), :mod:`~ekka_core.analysis.suspects` (where it was introduced, what encloses it),
:mod:`~ekka_core.analysis.conventions` (departures from the reference's own rounding, against the shipped noise
model ``convention_noise.json``).
"""

from ekka_core.analysis.conventions import (CONVENTION_CLOSER, CONVENTION_DISTANCE, CONVENTION_IDENTICAL,
                                            CONVENTION_NOISE_FACTOR, NOISE_MODEL_FILE, convention_noise,
                                            departure_distance)
from ekka_core.analysis.ranking import analyse
from ekka_core.analysis.ratios import error_ratio
from ekka_core.analysis.suspects import CONTAINERS, GlueLocator
from ekka_core.contracts.ranking import NON_FINITE_RATIO, PairResult, Ranking, Suspect

__all__ = ["NON_FINITE_RATIO", "PairResult", "Ranking", "Suspect", "analyse", "error_ratio", "GlueLocator",
           "CONVENTION_IDENTICAL", "CONVENTION_DISTANCE", "CONVENTION_CLOSER", "CONVENTION_NOISE_FACTOR",
           "NOISE_MODEL_FILE", "CONTAINERS", "convention_noise", "departure_distance"]
