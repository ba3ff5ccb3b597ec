"""Ekka: find where an LLM serving engine silently departs from a trusted reference.

The pipeline is one subpackage per stage, each with one entry function:
capture → tree → mapping → align → analysis → report (see ``ekka_core.pipeline``).
"""

__version__ = "0.1.0"

# The pipeline's stages, in order — here, not in ekka_core.pipeline, so that progress displays (the CLI with
# --executor, the language server) name them without importing the pipeline and torch with it.
STAGES = ("capture", "tree", "mapping", "align", "analysis", "report")
