"""The checks: each one question asked of a diagnosis' evidence, answered as a typed outcome (status, findings,
coverage); the composer alone turns the outcomes into the verdict (:mod:`ekka_core.checks.verdict`, whose docstring
is the precedence table).

``inputs``         the ids the engine fed against the reference's own rendering (``checks/inputs.py``)
``served-output``  the served configuration's logprobs against the reference (``checks/output.py``)
``traced-output``  the traced baseline's, the same way
``modules``        the traced module comparison: which module departs first (``checks/modules.py``)
``non-finite``     the first module that outputs NaN/Inf where the reference is finite (``checks/non_finite.py``)
``rows``           a module wrong on a few rows its pooled ratio averages away (``checks/rows.py``)
``conventions``    departures from the reference's low-precision rounding (``checks/conventions.py``)
``graph``          the engine's compiled graph against itself run eagerly, when triage found compilation decides
                   (``checks/graph.py``)

A new check: its module here, one line in :data:`AFTER_COMPARISON` (or where the pipeline sequences it), the
rendering of its findings' kind in ``ekka_core/report/findings.py``, its tests.
"""

from ekka_core.checks.base import Check, Evidence, run_check, skipped
from ekka_core.checks.conventions import ConventionCheck
from ekka_core.checks.graph import GraphCheck
from ekka_core.checks.non_finite import NonFiniteCheck
from ekka_core.checks.rows import RowCheck
from ekka_core.checks.verdict import Composed, compose, conclude

# The checks that read the traced comparison's evidence (the ranking and its aligned pairs), in the order they run;
# the graph check reads the in-graph localisation triage asked for (skipped, and said, when there is none).
AFTER_COMPARISON: tuple[Check, ...] = (
    NonFiniteCheck(),
    RowCheck(),
    ConventionCheck(),
    GraphCheck(),
)

__all__ = ["AFTER_COMPARISON", "Check", "Composed", "Evidence", "compose", "conclude", "run_check", "skipped"]
