"""Ekka: find where an LLM serving engine silently departs from a trusted reference.

The pipeline is one subpackage per stage, each with one entry function:
capture → tree → mapping → align → analysis → report (see ``ekka_core.pipeline``).
"""

__version__ = "0.1.0"
