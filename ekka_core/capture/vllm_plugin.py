"""Ekka's vLLM general plugin (entry point ``vllm.general_plugins: ekka``).

vLLM calls :func:`register` in every process it starts (engine core, tensor-parallel workers, ``vllm serve``),
alongside every other installed plugin — Ekka never changes which plugins load. It does nothing unless asked:
``EKKA_INJECT_BUG=<name>`` re-injects a known historical bug (benchmark and demo only).
"""

from __future__ import annotations

import os

_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    name = os.environ.get("EKKA_INJECT_BUG")
    if name:
        from ekka_core import bugs
        bugs.get(name).inject()
