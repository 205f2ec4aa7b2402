"""What ``model.to('cuda')`` of a full replica reserves on one GPU: the end of the model's unlimited walk
(:func:`oomlab.reproduction.walk.unlimited_walk`).  For a shipped model the figure is committed data
(``specs/replica-reserved.json``), so the plan imports no torch; any other model is walked (torch).

The table is generated, never edited: ``python -m oomlab.reproduction.replica > lib/oomlab/specs/replica-reserved.json``
walks every shipped model; ``tests/reproduction/test_replica.py`` re-derives it and fails when it is stale.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from typing import Any

from oomlab.core.models import known_models, load_model
from oomlab.core.paths import MODEL_SPECS_DIR, SPECS_DIR
from oomlab.core.resolved import config_digest

REPLICA_RESERVED = SPECS_DIR / "replica-reserved.json"
SHIPPED_DTYPES = ("float16",)  # the plan's configured row: the fp16 replica each process moves to its GPU


@cache
def _table() -> dict[str, Any]:
    return json.loads(REPLICA_RESERVED.read_text())


def replica_reserved_bytes(model: str, dtype: str) -> int:
    """Bytes the caching allocator reserves once a full replica of ``model`` (a shipped name or a config.json path)
    in ``dtype`` is on the GPU: the shipped figure where the model's ``config.json`` is the one it was walked from,
    the walk itself otherwise."""
    spec = load_model(model)
    entry = _table()["models"].get(spec.name)
    if entry is not None and dtype in entry["reserved_bytes"] and entry["config_sha256"] == config_digest(spec.config):
        return int(entry["reserved_bytes"][dtype])
    from oomlab.reproduction.walk import unlimited_walk  # torch: only for a model without a shipped figure

    return unlimited_walk(spec.name, dtype)[-1].reserved_bytes


def derive_table() -> dict[str, Any]:
    """The table, walked afresh: every shipped model in each of :data:`SHIPPED_DTYPES`."""
    from oomlab.reproduction.walk import unlimited_walk  # torch: regenerating the shipped figures

    models = {name: {"config_sha256": config_digest(json.loads((MODEL_SPECS_DIR / f"{name}.json").read_text())),
                     "reserved_bytes": {dtype: unlimited_walk(name, dtype)[-1].reserved_bytes
                                        for dtype in SHIPPED_DTYPES}}
              for name in known_models()}
    return {"_source": "derived by oomlab.reproduction.replica.derive_table: the reserved bytes at the end of each "
                       "shipped model's unlimited walk (Module.to('cuda') on a weightless model, the caching "
                       "allocator modelled)", "models": models}


if __name__ == "__main__":
    json.dump(derive_table(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
