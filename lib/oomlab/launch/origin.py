"""Where a value of the user's setup came from: a file and key (with its line), a command flag, a library's default
(with the library's version), or oomlab's assumption -- and the keys read but not modelled."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from oomlab.core.choices import plain


class OriginKind(enum.Enum):
    """What kind of place a value comes from."""

    FILE = "file"  # a key of one of the user's files
    FLAG = "flag"  # a flag of the launch command (launcher or script)
    DEFAULT = "default"  # a library's default for what the user left out (the library and its version)
    ASSUMED = "assumed"  # nothing says: oomlab's assumption (the pipeline parameter's default)


@dataclass(frozen=True)
class Origin:
    """One place: ``zero_config.json:33 zero_optimization.stage``, ``--gradient_checkpointing``, ``transformers 5.24
    default``, ``assumed``."""

    kind: OriginKind
    where: str  # the file's path, the command flag, the library and version, or the assumption's reason
    key: str = ""  # the dotted key inside a file
    line: int | None = None  # the 1-based line of the key in the file

    def __str__(self) -> str:
        if self.kind is OriginKind.FILE:
            place = self.where if self.line is None else f"{self.where}:{self.line}"
            return f"{place} {self.key}".strip()
        if self.kind is OriginKind.FLAG:
            return f"flag {self.where}"
        if self.kind is OriginKind.DEFAULT:
            return f"default of {self.where}" + (f" ({self.key})" if self.key else "")
        return f"assumed: {self.where}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "where": self.where, "key": self.key, "line": self.line, "text": str(self)}


def file_origin(path: str, key: str, line: int | None) -> Origin:
    return Origin(OriginKind.FILE, path, key, line)


def flag_origin(flag: str) -> Origin:
    return Origin(OriginKind.FLAG, flag)


def default_origin(library: str, what: str = "") -> Origin:
    return Origin(OriginKind.DEFAULT, library, what)


def assumed(reason: str) -> Origin:
    return Origin(OriginKind.ASSUMED, reason)


@dataclass(frozen=True)
class Sourced:
    """A value with its origin (and the other places that said the same)."""

    value: Any
    origin: Origin
    also: tuple[Origin, ...] = ()  # other places that agree

    @property
    def shown(self) -> str:
        """The value as a table or sentence writes it: a choice by its name, LoRA targets joined by commas."""
        value = plain(self.value)
        return ",".join(value) if isinstance(value, tuple) else str(value)

    def to_dict(self) -> dict[str, Any]:
        value = plain(self.value)
        return {"value": list(value) if isinstance(value, tuple) else value, "origin": self.origin.to_dict(),
                "also": [o.to_dict() for o in self.also]}


@dataclass(frozen=True)
class Unmodelled:
    """A key or flag that was read but does not enter the budget (listed, never dropped silently)."""

    origin: Origin
    value: Any
    why: str = "not modelled by oomlab"

    def __str__(self) -> str:
        return f"{self.origin} = {self.value!r}: {self.why}"

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin.to_dict(), "value": self.value, "why": self.why, "text": str(self)}
