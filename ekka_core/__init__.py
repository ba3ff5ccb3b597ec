"""Ekka: find where an LLM serving engine silently departs from a trusted reference.

The pipeline is one subpackage per stage, each with one entry function:
capture → tree → mapping → align → analysis → report (see ``ekka_core.pipeline``).
"""

__version__ = "0.1.0"

# The pipeline's stages, in order, with each one's share of the 0–100 progress scale (capturing, three real model
# runs, dominates the time) — the names progress is reported under, and the only definition of them: here, not in
# ekka_core.pipeline, so that progress displays (the CLI with --executor, the language server) name them without
# importing the pipeline and torch with it. The symptom check, the input checks and triage report as "capture".
STAGE_WEIGHTS = {"capture": 70, "tree": 5, "mapping": 5, "align": 5, "analysis": 10, "report": 5}
STAGES = tuple(STAGE_WEIGHTS)
