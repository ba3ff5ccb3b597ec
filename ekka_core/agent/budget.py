"""Token and dollar accounting with a hard cap checked *before* every API call.

Output tokens are bounded exactly: each request's ``max_tokens`` is lowered to what the output and dollar budgets
still allow, so the API cannot return more. Input tokens are not known before the call; they are estimated from
the request's size (conservatively: one token per 3 characters of JSON) and the call is refused when the estimate
would cross a limit. Actual usage, as the API reports it, is what is recorded and reported.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ekka_core.agent.config import AgentConfig
from ekka_core.contracts.jsonable import to_json
from ekka_core.contracts.report import AgentUsage

CHARS_PER_TOKEN = 3.0


@dataclass
class Usage(AgentUsage):
    """What the session has used so far; its fields are the report's ``agent.usage``."""

    def rounded(self) -> AgentUsage:
        """As the report holds it: dollars to the micro-dollar."""
        return AgentUsage(**{**asdict(self), "dollars": round(self.dollars, 6)})

    def to_json(self) -> dict[str, Any]:
        return to_json(self.rounded())


class BudgetExceeded(Exception):
    """The next call would cross a hard limit; ``what`` names it."""

    def __init__(self, what: str, detail: str):
        super().__init__(detail)
        self.what = what
        self.detail = detail


def estimate_tokens(request: dict[str, Any]) -> int:
    return int(len(json.dumps(request, default=str)) / CHARS_PER_TOKEN) + 16


class Budget:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.price, self.price_known = config.price()
        self.usage = Usage()
        self.exceeded: str | None = None        # which limit stopped the session, if one did

    def cost(self, input_tokens: int, output_tokens: int, cache_write: int = 0, cache_read: int = 0) -> float:
        p = self.price
        return (input_tokens * p["input"] + output_tokens * p["output"] + cache_write * p["cache_write"]
                + cache_read * p["cache_read"]) / 1e6

    def allow(self, estimated_input: int) -> int:
        """The ``max_tokens`` the next call may use; raises :class:`BudgetExceeded` when it may not be made."""
        c, u = self.config, self.usage
        floor = max(1, c.min_tokens_per_call)
        if u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens + estimated_input \
                > c.max_input_tokens:
            self._stop("input tokens", f"the next call (~{estimated_input} input tokens) would pass the limit of "
                                       f"{c.max_input_tokens} input tokens ({self._spent_in()} spent)")
        max_tokens = min(c.max_tokens_per_call, c.max_output_tokens - u.output_tokens)
        if max_tokens < floor:
            self._stop("output tokens", f"{u.output_tokens} of {c.max_output_tokens} output tokens spent; fewer "
                                        f"than {floor} left for another call")
        left = c.max_dollars - u.dollars - self.cost(estimated_input, 0)
        affordable = int(left * 1e6 / self.price["output"]) if self.price["output"] > 0 else max_tokens
        max_tokens = min(max_tokens, affordable)
        if max_tokens < floor:
            self._stop("dollars", f"${u.dollars:.4f} of ${c.max_dollars:.2f} spent; the next call (~{estimated_input} "
                                  f"input tokens + {floor} output tokens) would pass the limit")
        return max_tokens

    def record(self, usage: Any) -> None:
        """Add an API response's ``usage`` (SDK object or dict)."""
        def get(name: str) -> int:
            v = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
            return int(v or 0)
        i, o = get("input_tokens"), get("output_tokens")
        cw, cr = get("cache_creation_input_tokens"), get("cache_read_input_tokens")
        u = self.usage
        u.calls += 1
        u.input_tokens += i
        u.output_tokens += o
        u.cache_creation_input_tokens += cw
        u.cache_read_input_tokens += cr
        u.dollars += self.cost(i, o, cw, cr)

    def _spent_in(self) -> int:
        u = self.usage
        return u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens

    def _stop(self, what: str, detail: str) -> None:
        self.exceeded = what
        raise BudgetExceeded(what, detail)
