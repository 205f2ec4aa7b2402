"""oomlab: reproduce, explain and fix GPU out-of-memory failures in LLM training."""

from oomlab.units import GiB, KiB, MiB, format_size, parse_size

__all__ = ["GiB", "KiB", "MiB", "format_size", "parse_size", "__version__"]
__version__ = "0.1.0"
