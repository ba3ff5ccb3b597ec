"""Bug case ``engine-crash-mid-run``: test fault: the engine raises at its third step."""

from __future__ import annotations

from typing import Any

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.vllm_access import vllm_compat


def _crash_mid_run() -> None:
    """Not a historical bug: the engine dies at its third forward step (tests that partial traces are kept)."""
    lp = vllm_compat().logits_processor_module()

    original = lp.LogitsProcessor.forward
    calls = {"n": 0}

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise RuntimeError("injected engine crash (ekka test fault)")
        return original(self, *args, **kwargs)

    lp.LogitsProcessor.forward = forward


BUG = Bug("engine-crash-mid-run", "llama", "test fault: the engine raises at its third step", "(none)",
          r"$^", _crash_mid_run, benchmark=False)
