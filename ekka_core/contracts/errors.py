"""Errors that cross stage and process boundaries, each tied to one CLI exit code (DESIGN.md: 2 bad input,
3 failure), and their one wire format: :meth:`EkkaError.to_json` / :func:`EkkaError.from_json`, the *error envelope*
every process boundary uses (capture run process → pipeline, language-server engine process → server, remote host
process → client).
"""

from __future__ import annotations

import json
from typing import Any

ENVELOPE_KEY = "ekka_error"


class EkkaError(Exception):
    exit_code = 3

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} — {self.fix}" if self.fix else self.message

    # -- the error envelope ---------------------------------------------------------------------------------
    def to_json(self, *, traceback: str | None = None) -> dict[str, Any]:
        """``{"message", "fix", "exit_code"}`` (plus ``traceback`` for an internal failure, when known)."""
        d: dict[str, Any] = {"message": self.message, "fix": self.fix, "exit_code": self.exit_code}
        if traceback:
            d["traceback"] = traceback
        return d

    def envelope_line(self, *, traceback: str | None = None) -> str:
        """The envelope as the single line a child process writes last on stderr."""
        return json.dumps({ENVELOPE_KEY: self.to_json(traceback=traceback)})

    @staticmethod
    def from_json(d: dict[str, Any]) -> "EkkaError":
        """The error an envelope describes, as the class its exit code stands for (2 → BadInput, else
        InternalFailure): what crosses a process boundary is raised again on the other side unchanged."""
        cls = BadInput if d.get("exit_code") == 2 else InternalFailure
        err = cls(str(d.get("message") or "unknown error"), fix=d.get("fix"))
        err.traceback = d.get("traceback")
        return err

    @staticmethod
    def from_envelope_lines(text: str) -> "EkkaError | None":
        """The last envelope line in a child's stderr, if it wrote one."""
        for line in reversed(text.strip().splitlines()):
            if line.startswith('{"' + ENVELOPE_KEY + '"'):
                try:
                    return EkkaError.from_json(json.loads(line)[ENVELOPE_KEY])
                except (ValueError, KeyError, TypeError):
                    return None
        return None

    traceback: str | None = None


def internal_error(e: BaseException) -> "InternalFailure":
    """Any unexpected exception as an internal failure (exit 3), naming its type."""
    return InternalFailure(f"{type(e).__name__}: {e}")


class BadInput(EkkaError):
    """The user's input is wrong (model path, prompt, spec, traces that do not belong together). Exit code 2."""

    exit_code = 2


class InternalFailure(EkkaError):
    """Something broke that the user could not have prevented (engine crash, aligner bug). Exit code 3."""

    exit_code = 3


def engine_start_error(engine: str, model: str, error: Exception) -> EkkaError:
    """Why an engine (vLLM, SGLang) did not start, as Ekka's error: an architecture it does not support is bad input,
    anything else an internal failure. Engines report both as plain exceptions, and the telling line is not always
    the first (vLLM wraps config errors in a pydantic ValidationError)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()] or [type(error).__name__]
    unsupported = next((ln for ln in lines if "not supported" in ln.lower()), None)
    if unsupported:
        return BadInput(f"{engine} cannot load {model}: {unsupported.split('Supported architectures')[0]}",
                        fix=f"use an architecture this {engine} release supports")
    return InternalFailure(f"{engine} failed to start: {lines[0]}")
