"""oomlab: reproduce, explain and fix GPU out-of-memory failures in LLM training.

The library follows the pipeline, one subpackage per stage, importing only earlier stages:
``core`` → ``reproduction`` → ``explanation`` → ``budget`` → ``instruments`` → ``remedies`` → ``launch`` →
``evidence`` → ``report`` → ``pipeline``, with ``cli`` and ``explorer`` (its widgets over ``exploration``, what it
shows) on top.
``import oomlab`` stays light (no torch); the entry points below load their stage on first use.
"""

from oomlab.core.units import GiB, KiB, MiB, format_size, parse_size

__all__ = ["GiB", "KiB", "MiB", "check", "estimate", "explain", "format_size", "parse_size", "plan", "reproduce",
           "__version__"]
__version__ = "0.1.0"

# name -> (module, function); no submodule of this package carries one of these names, so importing any
# submodule can never shadow them (a submodule import sets an attribute of the same name on the package).
_ENTRY_POINTS = {
    "estimate": ("oomlab.budget.api", "estimate"),
    "reproduce": ("oomlab.reproduction.replay", "reproduce"),
    "explain": ("oomlab.explanation.explain", "explain"),
    "plan": ("oomlab.remedies.plan", "make_plan"),
    "check": ("oomlab.launch.check", "check"),
}


def __getattr__(name: str):  # lazy: ``import oomlab`` stays light; torch loads only when needed
    if name in _ENTRY_POINTS:
        import importlib

        module, function = _ENTRY_POINTS[name]
        entry = getattr(importlib.import_module(module), function)
        globals()[name] = entry  # later look-ups find it directly (module __getattr__ runs only for missing names)
        return entry
    raise AttributeError(f"module 'oomlab' has no attribute {name!r}")
