"""What ``model.to('cuda')`` of a full replica reserves on one GPU: the end of the model's unlimited walk
(:func:`oomlab.reproduction.walk.unlimited_walk`, over the module tree: no torch for a shipped model, in any dtype)."""

from __future__ import annotations

from oomlab.reproduction.walk import unlimited_walk


def replica_reserved_bytes(model: str, dtype: str) -> int:
    """Bytes the caching allocator reserves once a full replica of ``model`` (a shipped name or a config.json path)
    in ``dtype`` is on the GPU."""
    return unlimited_walk(model, dtype)[-1].reserved_bytes
