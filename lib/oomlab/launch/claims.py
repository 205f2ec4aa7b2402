"""What each place says about a setup field, and the one value that wins: explicit statements must agree (else an
error naming both places), a library's default gives way to any statement, oomlab's assumption to anything."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from oomlab.core.choices import plain
from oomlab.core.errors import LaunchConflictError
from oomlab.launch.origin import Origin, Sourced


class Strength(enum.IntEnum):
    """How strongly a place states a value (lower wins)."""

    STATED = 0  # a file's key or a command's flag
    WEAK = 1  # stated, but overridden by any statement (accelerate's mixed_precision 'no' under the Trainer's flags)
    DEFAULT = 2  # a library's default for what was left out
    ASSUMED = 3  # oomlab's assumption


@dataclass
class Claims:
    """Everything stated about each field, in the order read."""

    said: dict[str, list[tuple[Any, Origin, Strength]]] = field(default_factory=dict)
    overridden: list[tuple[Origin, Any, str]] = field(default_factory=list)
    locked: dict[str, str] = field(default_factory=dict)  # field -> why later statements are overridden

    def say(self, name: str, value: Any, origin: Origin, strength: Strength = Strength.STATED) -> None:
        if name in self.locked:
            if strength < Strength.DEFAULT:
                self.overridden.append((origin, value, self.locked[name]))
            return
        self.said.setdefault(name, []).append((value, origin, strength))

    def override(self, name: str, value: Any, origin: Origin, why: str) -> None:
        """``origin`` decides ``name`` whatever else says it (the DeepSpeed JSON's optimizer over ``--optim``)."""
        for old_value, old_origin, strength in self.said.pop(name, ()):
            if strength < Strength.DEFAULT:
                self.overridden.append((old_origin, old_value, why))
        self.said[name] = [(value, origin, Strength.STATED)]
        self.locked[name] = why

    def stated(self, name: str) -> bool:
        return any(s is Strength.STATED for _, _, s in self.said.get(name, ()))

    def winner(self, name: str) -> Sourced | None:
        """The value that wins, with the agreeing places; two different statements raise naming both."""
        claims = self.said.get(name)
        if not claims:
            return None
        best = min(s for _, _, s in claims)
        top = [(v, o) for v, o, s in claims if s == best]
        first_value, first_origin = top[0]
        for value, origin in top[1:]:
            if _shown(value) != _shown(first_value):
                raise LaunchConflictError(
                    f"contradiction in {name}: {first_origin} says {_shown(first_value)!r} but {origin} says "
                    f"{_shown(value)!r}; make them agree")
        for value, origin, strength in claims:
            if strength < Strength.DEFAULT and strength != best and _shown(value) != _shown(first_value):
                self.overridden.append((origin, value, f"overridden by {first_origin} ({name} "
                                                       f"{_shown(first_value)!r})"))
        return Sourced(first_value, first_origin, tuple(o for _, o in top[1:]))


def _shown(value: Any) -> Any:
    value = plain(value)
    return tuple(value) if isinstance(value, list) else value
