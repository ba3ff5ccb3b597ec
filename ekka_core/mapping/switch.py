"""The mapping rules' off switch.

**Rules off** (``map_components(..., rules=False)``, or ``EKKA_MAPPING_RULES=off`` in the environment of a
diagnosis, CLI and language server included): every module is left ``Unmapped`` with status ``rules-off``, so the knowledge
base and the mapping agent (:mod:`ekka_core.agent`) map the whole architecture. For testing and measuring the agent
on models the rules already know; a real diagnosis keeps the rules on.
"""

from __future__ import annotations

import os
import typing

RULES_ENV = "EKKA_MAPPING_RULES"
RULES_OFF_REASON = f"no rule: the mapping rules are disabled ({RULES_ENV}=off)"


def rules_enabled(env: typing.Mapping[str, str] | None = None) -> bool:
    """False when ``EKKA_MAPPING_RULES`` (in ``env``, default ``os.environ``) is off / 0 / false / no."""
    value = (os.environ if env is None else env).get(RULES_ENV, "")
    return value.strip().lower() not in ("off", "0", "false", "no")
