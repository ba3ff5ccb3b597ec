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
