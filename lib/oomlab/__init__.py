"""oomlab: reproduce, explain and fix GPU out-of-memory failures in LLM training."""

from oomlab.units import GiB, KiB, MiB, format_size, parse_size

__all__ = ["GiB", "KiB", "MiB", "estimate", "explain", "format_size", "parse_size", "reproduce", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: ``import oomlab`` stays light; torch loads only when needed
    if name == "estimate":
        from oomlab.budget import estimate

        return estimate
    if name == "reproduce":
        from oomlab.reproduce import reproduce

        return reproduce
    if name == "explain":
        from oomlab.explain import explain

        return explain
    raise AttributeError(f"module 'oomlab' has no attribute {name!r}")
