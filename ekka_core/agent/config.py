"""The agent's configuration: model, endpoint, hard budget, retry policy, knowledge-base location.

:meth:`AgentConfig.from_env` reads the environment (``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, ``EKKA_AGENT*``,
``EKKA_KNOWLEDGE_DIR``); tests build an :class:`AgentConfig` directly (local fake server, injected ``sleep``).
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

# The current Claude Sonnet (2026-11). claude-sonnet-4-5 still works but the SDK flags it deprecated (EOL 2026-11-30).
DEFAULT_MODEL = "claude-sonnet-5-5"

# USD per million tokens: input, output, 5-minute cache write, cache read (Anthropic's published list prices).
# A model missing here is priced at the most expensive row (UNKNOWN_MODEL_PRICE) so the hard budget stays a bound.
# Cache reads are kept at the higher of the published values where they changed (a budget must not under-count).
PRICES: dict[str, dict[str, float]] = {
    "claude-sonnet-5-5": {"input": 2.0, "output": 10.0, "cache_write": 2.50, "cache_read": 0.20},
    "claude-sonnet-5": {"input": 2.0, "output": 10.0, "cache_write": 2.50, "cache_read": 0.20},
    "claude-opus-5-5": {"input": 4.0, "output": 20.0, "cache_write": 5.00, "cache_read": 0.20},
    "claude-opus-5": {"input": 5.0, "output": 25.0, "cache_write": 6.25, "cache_read": 0.50},
    "claude-sonnet-4-5": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.30},
    "claude-sonnet-4": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.30},
    "claude-opus-4-5": {"input": 5.0, "output": 25.0, "cache_write": 6.25, "cache_read": 0.50},
    "claude-opus-4-1": {"input": 15.0, "output": 75.0, "cache_write": 18.75, "cache_read": 1.50},
    "claude-haiku-4-5": {"input": 1.0, "output": 5.0, "cache_write": 1.25, "cache_read": 0.10},
}


def price_for(model: str, prices: Mapping[str, Mapping[str, float]] | None = None
              ) -> tuple[dict[str, float], bool]:
    """``(price row, known)`` for ``model``: an exact id or a dated snapshot (``<id>-YYYYMMDD``). Unknown models get
    the most expensive row of the table (``known`` False) — the budget then over-estimates, never under-estimates."""
    table = dict(PRICES if prices is None else prices)
    if model in table:
        return dict(table[model]), True
    for key, row in table.items():
        if re.fullmatch(re.escape(key) + r"-\d{8}", model):
            return dict(row), True
    worst = max(table.values(), key=lambda r: (r["output"], r["input"])) if table else \
        {"input": 15.0, "output": 75.0, "cache_write": 18.75, "cache_read": 1.50}
    return dict(worst), False


def default_kb_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("EKKA_KNOWLEDGE_DIR"):
        return Path(env["EKKA_KNOWLEDGE_DIR"])
    return Path(env.get("HOME") or Path.home()) / ".cache" / "ekka" / "knowledge"


@dataclass
class AgentConfig:
    model: str = DEFAULT_MODEL
    api_key: str | None = None            # None: the agent does not call the API (components stay unchecked)
    base_url: str | None = None           # None: the SDK's default (https://api.anthropic.com)
    enabled: bool = True                  # False: knowledge base only, never the API

    # Hard budget for one complete_mapping call, enforced before every API call.
    max_input_tokens: int = 800_000
    max_output_tokens: int = 60_000
    max_dollars: float = 2.00
    max_tokens_per_call: int = 8_192      # the request's max_tokens (lowered to what the budget still allows)
    min_tokens_per_call: int = 512        # below this the next call is not worth making: the budget is spent
    prices: dict[str, dict[str, float]] = field(default_factory=lambda: {k: dict(v) for k, v in PRICES.items()})

    # Loop bounds.
    max_rounds: int = 3                   # validator rounds (finish → validate → feedback)
    max_calls: int = 40                   # API calls in total
    max_malformed: int = 5                # malformed tool calls (unknown tool, bad arguments) before giving up

    # Our own bounded retry loop (the SDK's retries are off: max_retries=0 on the client).
    max_retries: int = 3                  # per API call, for 429 / 5xx / timeouts / connection errors
    backoff_s: float = 1.0                # first back-off; doubles per retry
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0      # a 429's retry-after longer than this ends the session instead
    timeout_s: float = 180.0              # per request
    sleep: Callable[[float], None] = time.sleep

    # Knowledge base.
    use_kb: bool = True
    shipped_kb: bool = True               # also read the entries shipped in ekka_core/agent/knowledge/
    kb_dir: Path | None = None            # read and written; None → $EKKA_KNOWLEDGE_DIR or ~/.cache/ekka/knowledge
    write_kb: bool = True

    # Used for the knowledge-base key when no traces are given (they carry the framework versions).
    target_version: str | None = None
    reference_version: str | None = None

    # Tools.
    match_tolerance: float = 0.05         # relative L2 error under which infer_tensor_match calls a candidate a match
    max_tool_result_chars: int = 24_000
    aligner_timeout_s: float = 30.0

    notes: list[str] = field(default_factory=list)   # configuration problems that were worked around

    def resolved_kb_dir(self) -> Path:
        return Path(self.kb_dir) if self.kb_dir is not None else default_kb_dir()

    def price(self) -> tuple[dict[str, float], bool]:
        return price_for(self.model, self.prices)

    def budget_json(self) -> dict[str, Any]:
        row, known = self.price()
        return {"max_input_tokens": self.max_input_tokens, "max_output_tokens": self.max_output_tokens,
                "max_dollars": self.max_dollars, "price_per_mtok": row, "price_known": known}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "AgentConfig":
        """``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, ``EKKA_AGENT`` (0/off/false: knowledge base only),
        ``EKKA_KNOWLEDGE_BASE`` (0/off/false: no knowledge base, shipped or written),
        ``EKKA_AGENT_MODEL``, ``EKKA_AGENT_MAX_DOLLARS``, ``EKKA_AGENT_MAX_INPUT_TOKENS``,
        ``EKKA_AGENT_MAX_OUTPUT_TOKENS``, ``EKKA_KNOWLEDGE_DIR``. A malformed number is ignored with a note (the
        default applies) rather than failing a diagnosis that already captured its traces."""
        env = dict(os.environ if env is None else env)
        cfg = cls(api_key=env.get("ANTHROPIC_API_KEY") or None, base_url=env.get("ANTHROPIC_BASE_URL") or None,
                  kb_dir=default_kb_dir(env))
        if env.get("EKKA_AGENT", "").strip().lower() in ("0", "off", "false", "no"):
            cfg.enabled = False
        if env.get("EKKA_KNOWLEDGE_BASE", "").strip().lower() in ("0", "off", "false", "no"):
            cfg.use_kb = False        # map with the rules (and the agent) alone, e.g. to see what they cover
        if env.get("EKKA_AGENT_MODEL"):
            cfg.model = env["EKKA_AGENT_MODEL"].strip()
        for var, attr, kind in (("EKKA_AGENT_MAX_DOLLARS", "max_dollars", float),
                                ("EKKA_AGENT_MAX_INPUT_TOKENS", "max_input_tokens", int),
                                ("EKKA_AGENT_MAX_OUTPUT_TOKENS", "max_output_tokens", int)):
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                value = kind(raw.strip())
                if not math.isfinite(value) or value < 0:
                    raise ValueError
            except ValueError:
                cfg.notes.append(f"{var}={raw!r} is not a non-negative number; using {getattr(cfg, attr)}")
                continue
            setattr(cfg, attr, value)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg
