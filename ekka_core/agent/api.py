"""Calling the Anthropic Messages API with our own bounded, deterministic retry loop.

The SDK client is built with ``max_retries=0``: every retry decision is made here, with an injectable ``sleep`` so
tests are fast and exact. Policy:

* 401 / 403 — the key is rejected: stop at once with a message that says so (never retried);
* 429 — retried up to ``max_retries`` times, waiting what ``retry-after-ms`` / ``retry-after`` say (or the
  exponential back-off when absent); a wait longer than ``max_retry_after_s`` stops instead;
* 5xx, 529 (overloaded), 408, 409 — retried with exponential back-off (or the server's ``retry-after``);
* timeouts, connection errors — retried with back-off, then reported as unreachable;
* other 4xx (400 bad request, 404 unknown model, 413 too large) — stop with the API's own message.

Every stop is an :class:`AgentStop` carrying an outcome ``status``, the ``reason`` recorded on each component that
stays unmapped, and a message for people.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

from ekka_core.agent.config import AgentConfig

REASON_NO_KEY = "unchecked: no API key (set ANTHROPIC_API_KEY to let the agent map it)"
REASON_UNREACHABLE = "unchecked: API unreachable"
REASON_TIMEOUT = "unchecked: API timed out"
REASON_KEY_REJECTED = "unchecked: API key rejected (HTTP {status})"
REASON_RATE_LIMITED = "unchecked: API rate limit (HTTP 429) persisted"
REASON_API_ERROR = "unchecked: API error (HTTP {status})"
REASON_BUDGET = "unchecked: agent budget exceeded ({what})"
REASON_DISABLED = "unchecked: agent disabled (EKKA_AGENT=0); no knowledge-base entry either"
REASON_GAVE_UP = "unchecked: the agent could not map it ({why})"
REASON_FAILED = "unchecked: agent failed ({why})"
REASON_NO_SDK = "unchecked: the anthropic package is not installed (pip install 'ekka[agent]')"


class AgentStop(Exception):
    def __init__(self, status: str, reason: str, message: str):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def make_client(config: AgentConfig) -> Any:
    import anthropic

    kwargs: dict[str, Any] = {"api_key": config.api_key, "max_retries": 0, "timeout": config.timeout_s}
    if config.base_url:
        kwargs["base_url"] = config.base_url
    try:
        return anthropic.Anthropic(open_telemetry=False, **kwargs)
    except TypeError:               # an SDK without the open_telemetry option
        return anthropic.Anthropic(**kwargs)


def retry_after(headers: Any) -> float | None:
    """Seconds a response asks us to wait: ``retry-after-ms``, then ``retry-after`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(raw))
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


class Caller:
    """``create(**request)`` → the SDK's ``Message``; retries as described in the module docstring."""

    def __init__(self, config: AgentConfig, client: Any | None = None):
        self.config = config
        self.client = client if client is not None else make_client(config)
        self.retries = 0
        self.events: list[str] = []          # one line per retry / failure, for the outcome

    def create(self, **request: Any) -> Any:
        import anthropic

        c = self.config
        attempt = 0
        while True:
            try:
                return self.client.messages.create(**request)
            except anthropic.APIStatusError as e:
                status = int(getattr(e, "status_code", 0) or 0)
                detail = getattr(e, "api_message", None) or _body_message(e) or str(e)
                if status in (401, 403):
                    what = "rejected" if status == 401 else "not permitted for this request"
                    raise AgentStop("auth-failed", REASON_KEY_REJECTED.format(status=status),
                                    f"the Anthropic API {what} the API key (HTTP {status}: {detail}); check "
                                    "ANTHROPIC_API_KEY") from None
                retryable = status == 429 or status >= 500 or status in (408, 409)
                if not retryable:
                    hint = f" (is {request.get('model')!r} a model id this key can use?)" if status == 404 else ""
                    raise AgentStop("api-error", REASON_API_ERROR.format(status=status),
                                    f"the Anthropic API refused the request (HTTP {status}: {detail}){hint}") from None
                wait = retry_after(getattr(getattr(e, "response", None), "headers", None))
                if wait is None:
                    wait = self._backoff(attempt)
                if attempt >= c.max_retries or (status == 429 and wait > c.max_retry_after_s):
                    if status == 429:
                        raise AgentStop("rate-limited", REASON_RATE_LIMITED,
                                        f"the Anthropic API kept rate-limiting (HTTP 429: {detail}) after "
                                        f"{attempt} retries" + (f"; it asked to wait {wait:.0f} s, more than the "
                                                                f"{c.max_retry_after_s:.0f} s allowed"
                                                                if wait > c.max_retry_after_s else "")) from None
                    raise AgentStop("api-error", REASON_API_ERROR.format(status=status),
                                    f"the Anthropic API failed (HTTP {status}: {detail}) after {attempt} "
                                    "retries") from None
                self._retry(attempt, wait, f"HTTP {status} ({detail})")
            except anthropic.APITimeoutError:
                if attempt >= c.max_retries:
                    raise AgentStop("timeout", REASON_TIMEOUT,
                                    f"the Anthropic API did not answer within {c.timeout_s:g} s "
                                    f"({attempt + 1} attempts)") from None
                self._retry(attempt, self._backoff(attempt), "timeout")
            except anthropic.APIConnectionError as e:
                if attempt >= c.max_retries:
                    where = c.base_url or "https://api.anthropic.com"
                    raise AgentStop("unreachable", REASON_UNREACHABLE,
                                    f"the Anthropic API at {where} is unreachable ({e}; {attempt + 1} attempts): "
                                    "check the network or ANTHROPIC_BASE_URL") from None
                self._retry(attempt, self._backoff(attempt), f"connection error ({e})")
            attempt += 1

    def _backoff(self, attempt: int) -> float:
        """Exponential back-off, capped: the wait before retry ``attempt + 1`` when the API names none."""
        return min(self.config.backoff_s * (2 ** attempt), self.config.max_backoff_s)

    def _retry(self, attempt: int, wait: float, why: str) -> None:
        self.retries += 1
        self.events.append(f"retry {attempt + 1}/{self.config.max_retries} after {why}: waiting {wait:.2f} s")
        self.config.sleep(wait)


def _body_message(e: Any) -> str | None:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return err.get("message")
    return None
