"""Every error oomlab raises on purpose, in one place.

Bad user input is an :class:`OomlabError` (a ``ValueError``; the CLI turns it into exit code 2): its message names
the bad value and lists what is accepted.  A failed pipeline run or report is a :class:`PipelineError` /
:class:`ReportError` (``RuntimeError``; exit code 1).
"""

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


class LaunchFileError(InvalidValueError):
    """A launch file that cannot be read: missing, malformed (with the line), or not a mapping."""


class LaunchConflictError(InvalidValueError):
    """Two of the user's files or flags say different things about the same field."""


class UnmodelledSettingError(InvalidValueError):
    """A launch setting that moves memory in a way oomlab does not budget (context parallelism, an optimizer stepped
    inside backward, selective activation checkpointing): refused naming the key or flag, where it was read, what it
    does and what oomlab models, never budgeted as if absent."""


class OutputFolderError(InvalidValueError):
    """An output folder a run may not write: it holds files no oomlab run wrote, another run holds its lock, or it
    cannot be created or written."""


class NotAnOomMessageError(OomlabError):
    """The input holds no CUDA out-of-memory message of PyTorch's caching allocator."""


class PipelineError(RuntimeError):
    """A notebook failed (error, timeout or dead kernel) or did not write its results."""


class ReportError(RuntimeError):
    """The rendered report would not be self-contained."""
