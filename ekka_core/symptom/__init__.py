"""The symptom check (before capture): is there a bug at all, in a given engine configuration, at the output level?

Entry point: :func:`check_symptom` (:mod:`ekka_core.symptom.check`): an untraced engine run's sampled logprobs
against the reference teacher-forced on the same tokens (:class:`~ekka_core.contracts.scores.ReferenceScores`), as
one error ratio per position and over the run.
"""

from ekka_core.symptom.check import check_symptom

__all__ = ["check_symptom"]
