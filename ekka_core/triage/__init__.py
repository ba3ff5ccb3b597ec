"""Configuration triage: which served features make the difference between a diverging and a clean run.

Entry point: :func:`triage`. Given the symptom check of the served configuration and of the traced baseline (eager,
no prefix cache, whole prompts, one request at a time), when exactly one of them diverges, the factors in which the
two differ (:data:`~ekka_core.contracts.serving.FACTORS`, as each engine resolved them) are searched with delta
debugging (Zeller's ddmin): the smallest set of served features that, added to the baseline, still makes it
diverge (or, the other way round, that added to the baseline makes it clean). Each trial is one untraced engine run
scored against the reference; the caller supplies it, so this module stays an algorithm with no engine in it.

Factors that cannot matter for these requests are ruled out before any trial, with the reason (no request hit the
prefix cache; every wave's prompts fit one chunk; every wave holds one request); those ruled out by the waves alone
keep their served values in every trial (:func:`kept_as_served`). Cheaper trials (eager) run before dearer ones
(compiled) wherever delta debugging leaves the order free.
"""

from ekka_core.triage.factors import compile_backend_words, differing_factors, kept_as_served
from ekka_core.triage.search import RunTrial, triage

__all__ = ["RunTrial", "compile_backend_words", "differing_factors", "kept_as_served", "triage"]
