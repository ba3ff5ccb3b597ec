"""``ekka bisect``: which engine release broke it, and which lines changed.

Entry point: :func:`bisect` (:mod:`~ekka_core.bisect.search`). Given a diagnosis spec and an ordered list of
engine releases (oldest first; each gets an environment built once and kept, :mod:`ekka_core.bisect.envs`) or of
interpreters the user already has (:mod:`~ekka_core.bisect.candidates`), it diagnoses releases by bisection —
*good* is the verdict ``consistent``, *bad* anything else (``divergent``, ``inputs-differ``) — until the last good
and first bad are adjacent in the list (and, when releases after the one seen bad are consistent again, the last bad
and first good: the fix). The target runs with each release's interpreter; the reference (HF Transformers) always
runs in Ekka's own environment, so it is the same for every release. Each release's diagnosis is cached under
``ENV_ROOT/diagnoses/<spec fingerprint>/<release>-<python>/``: a later bisection of the same diagnosis reuses its
traces (and the capture re-checks them: same inputs, same interpreter).

At the first bad release the usual diagnosis names the suspect; then :func:`ekka_core.bisect.changes.what_changed`
diffs the suspect's class and the engine functions it calls between the two releases' installed sources. The
report (``OUT/report.json``) is the first bad release's diagnosis with a top-level ``bisect`` object.
"""

from ekka_core.bisect.candidates import Candidate, candidates_from, parse_env_arg
from ekka_core.bisect.search import (SCHEMA, UNTESTABLE, BisectResult, Progress, Tried, _search, bisect,
                                     check_on_index)

__all__ = ["bisect", "BisectResult", "Candidate", "Tried", "candidates_from", "parse_env_arg", "SCHEMA"]
