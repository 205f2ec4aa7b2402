"""A package's public API, loaded on first use (PEP 562), as every stage's ``__init__`` declares it.

A stage names its main public names once, by the module of its own that defines each; ``import oomlab.budget`` (and
every import of one of its modules, which runs the package's ``__init__`` first) then costs no more than before, and
the analytic path never loads torch through a name it does not use.  A name can only come from the package's own
modules, so an ``__init__`` cannot import a later stage.

NB: an exported name must not be a module of the package as well: importing that module binds the package attribute
to the module (``budget/api.py`` defines :func:`~oomlab.budget.estimate`, not ``budget/estimate.py``); a test checks it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Mapping[str, Sequence[str]]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``, exporting each name of ``names[module]`` from its
    own module ``package.module``; the first access imports that module and keeps the value on the package."""
    source: dict[str, str] = {}
    for module, exported in names.items():
        for name in exported:
            if name in source:
                raise ValueError(f"{package} exports {name!r} twice: from {source[name]} and {package}.{module}")
            source[name] = f"{package}.{module}"

    def __getattr__(name: str) -> Any:
        if name not in source:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source[name]), name)
        setattr(sys.modules[package], name, value)  # found directly from now on (__getattr__ runs for missing names)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(source))

    return sorted(source), __getattr__, __dir__
