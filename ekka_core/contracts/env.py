"""The environment a diagnosis may be given from outside (the editor's ``env``, a remote job): ``EKKA_*`` only.

Such variables change what the engine computes (``EKKA_INJECT_BUG`` re-injects a known bug) and are part of the
trace-reuse fingerprint; anything else (credentials, paths) is refused rather than passed to the engine.
"""

from __future__ import annotations

from typing import Any

PREFIX = "EKKA_"
# Re-injects a named benchmark bug into the engine (Ekka's vLLM plugin, in every engine process): a diagnosis run
# with it says so first in its report (RunMeta.injected_bug).
INJECT_BUG = "EKKA_INJECT_BUG"


def check_ekka_env(env: Any) -> str | None:
    """Why ``env`` is not a mapping of ``EKKA_*`` names to strings, or None when it is (None counts as empty)."""
    if env is None:
        return None
    if not isinstance(env, dict):
        return f"must map {PREFIX}* names to strings, got {type(env).__name__}"
    bad = sorted(str(k) for k, v in env.items() if not (isinstance(k, str) and k.startswith(PREFIX)
                                                         and isinstance(v, str)))
    if bad:
        return f"must map {PREFIX}* names to strings; refused: {', '.join(bad)}"
    return None
