"""Errors that cross stage boundaries, each tied to one CLI exit code (DESIGN.md: 2 bad input, 3 failure)."""

from __future__ import annotations


class EkkaError(Exception):
    exit_code = 3

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} — {self.fix}" if self.fix else self.message


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
