"""Errors for bad user input. Every message names the bad value and lists what is accepted."""

from __future__ import annotations

from collections.abc import Iterable


class OomlabError(ValueError):
    """Base class: bad input to oomlab (the CLI turns it into exit code 2)."""


class UnknownNameError(OomlabError):
    """A model, GPU, dtype or other name that oomlab does not know."""

    def __init__(self, kind: str, value: object, known: Iterable[str], hint: str = "") -> None:
        self.kind = kind
        self.value = value
        self.known = sorted(known)
        message = f"unknown {kind} {value!r}; known: {', '.join(self.known)}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class InvalidValueError(OomlabError):
    """A value of the right kind but outside what is accepted (a negative size, say)."""
