"""The capture stage: engine runs as served, and three traces on the same token sequence.

Entry points:

* :func:`capture` — the traced comparison. The target runs one engine configuration (the traced baseline, or the
  baseline with the factors triage found) and generates (X_T); the reference is then teacher-forced on the ids the
  target fed and generated, in the same low precision (X_R) and in fp32 (Y_R).
* :func:`run_engine` — one untraced engine run in a given configuration (the served one, a triage trial): the ids
  its request path fed, what it generated and the logprobs it sampled from (``outputs.json``), scored against the
  reference teacher-forced on the same tokens (``reference-scores.json``). The served run's reference runs beside
  the traced target (``capture(beside=…)``: the second core), and scores it too (:func:`keep_scores`).
* :func:`localise_compiled` — one untraced run of a compiled configuration whose compiled graphs are localised
  piece by piece inside the engine process (:mod:`ekka_core.graph`, through :mod:`~ekka_core.capture.vllm_graphs`).

Each run happens in its own process (``python -m ekka_core.capture.run_process``): an engine crash cannot take
the caller down, what it captured so far is kept on disk marked incomplete, and vLLM's process-wide settings
(threads, environment) never leak into the reference run. Runs are reused while their inputs are unchanged
(:mod:`~ekka_core.capture.runs`). A target trace captured outside Ekka: :mod:`~ekka_core.capture.external`.
"""

from ekka_core.capture.external import external_target, spec_for_trace
from ekka_core.capture.runs import (ENGINE_ENV, CaptureResult, EngineRun, Progress, capture, keep_scores, load,
                                    localise_compiled, run_engine, score_run)
from ekka_core.capture.trace import INDEX
from ekka_core.contracts.scores import SCORES_FILE, SCORES_SCHEMA
from ekka_core.contracts.serving import OUTPUTS_FILE

__all__ = ["capture", "CaptureResult", "EngineRun", "keep_scores", "load", "localise_compiled", "run_engine", "score_run", "INDEX",
           "SCORES_FILE", "SCORES_SCHEMA"]
