"""How far a remedy stretches: its per-GPU peak and fit over micro-batch × sequence length."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from oomlab.core.errors import InvalidValueError
from oomlab.remedies.remedy import Evaluator, Remedy


@dataclass(frozen=True)
class FitMap:
    """Per-GPU peak of one remedy over micro-batch × sequence length."""

    name: str
    batches: tuple[int, ...]
    seqs: tuple[int, ...]
    peak_bytes: tuple[tuple[int, ...], ...]  # [batch index][seq index]
    fits: tuple[tuple[bool, ...], ...]
    capacity_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "batches": list(self.batches), "seqs": list(self.seqs),
                "peak_bytes": [list(r) for r in self.peak_bytes], "fits": [list(r) for r in self.fits],
                "capacity_bytes": self.capacity_bytes}


def fit_map(remedy: Remedy, host_ram_bytes: int, batches: Iterable[int] = (1, 2, 4, 8, 16, 32),
            seqs: Iterable[int] | None = None, outside_bytes: int | None = None) -> FitMap:
    """The remedy's per-GPU peak and fit at every (micro-batch, sequence length) of the grid."""
    if remedy.setup is None:
        raise InvalidValueError(f"remedy {remedy.name!r} was dropped ({remedy.reason}); it has no fit map")
    setup = remedy.setup
    if seqs is None:
        top = setup.model.max_position_embeddings
        seqs = tuple(s for s in (128, 256, 512, 1024, 2048, 4096, 8192) if s <= top)
    batches, seqs = tuple(batches), tuple(seqs)
    ev_fn = Evaluator(host_ram_bytes, outside_bytes)
    placement = ev_fn(setup, route=remedy.route).placement
    peaks, fits = [], []
    for b in batches:
        evs = [ev_fn(replace(setup, batch=b, seq=s), placement, remedy.route) for s in seqs]
        peaks.append(tuple(e.per_gpu_peak_bytes for e in evs))
        fits.append(tuple(e.fits for e in evs))
    return FitMap(remedy.name, batches, seqs, tuple(peaks), tuple(fits), setup.gpu.total_memory_bytes)
