"""A floor under a setup's per-GPU peak and host RAM on one GPU type, from the same setup budgeted on another: what
lets the hardware search (:mod:`oomlab.remedies.hardware`) skip, without budgeting it, a candidate that cannot fit.

The analytic budget (:func:`oomlab.budget.estimator.estimate_setup`) reads three things of the GPU: its capacity
(``capacity_bytes``), the memory outside PyTorch for that GPU and world size (``analytic._outside``,
``budget/analytic.py``), and -- for Liger's fused loss only -- its compute capability
(``loss_kernels.liger_accumulate_bytes``, ``budget/loss_kernels.py``).  Everything PyTorch allocates, and the host
RAM, is otherwise the same on every GPU type.  So a setup budgeted on GPU ``h`` gives, for its twin on GPU ``g``
(every field equal but the GPU):

    floor_peak(g) = peak(h) - outside(h) + outside(g)        floor_host(g) = host(h)

NB: under today's budget these are the twin's exact figures; the search uses them only as floors (a candidate whose
floor is over the GPU's capacity or the host RAM cannot fit, so it is not budgeted; any other is budgeted in full),
and ``tests/remedies/test_peak_floor.py`` checks ``floor <= budget`` for every candidate of the search's grid on every
GPU type, for several models and methods, so a budget that starts to depend on the GPU in another way fails there
rather than changing an answer silently.

Limitations: only the process-per-GPU route (the device-map route places layers by the GPU's capacity); one instance
per search (one ``outside_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

from oomlab.budget.result import BudgetResult, MemCategory
from oomlab.core.gpus import GPUSpec
from oomlab.core.setup import TrainingSetup

__all__ = ["Floor", "PeakFloors"]

# every field of the setup the budget may read but the GPU and the micro-batch (the key puts the batch first; the GPU's
# compute capability is added where the budget reads it)
_FIELDS = attrgetter(*(f.name for f in fields(TrainingSetup) if f.name not in ("gpu", "batch")))


@dataclass(frozen=True)
class Floor:
    """Lower bounds of one setup's budget on one GPU type (no more than :func:`estimate_setup` would give)."""

    peak_bytes: int  # per GPU, what nvidia-smi would show at the peak
    host_ram_bytes: int  # per node

    def fits(self, gpu: GPUSpec, host_ram_bytes: int) -> bool:
        """Could the setup fit: its floors within the GPU's capacity and the host RAM (False: it cannot)."""
        return self.peak_bytes <= gpu.total_memory_bytes and self.host_ram_bytes <= host_ram_bytes


class PeakFloors:
    """Every process-per-GPU budget of one search, by its setup without the GPU: floors for the same setup on the
    other GPU types."""

    def __init__(self) -> None:
        self._inside: dict[tuple, tuple[int, int]] = {}  # twin key -> (peak - outside, host RAM)
        self._outside: dict[tuple[str, str, int], int] = {}  # (model, GPU, world size) -> bytes outside PyTorch

    @staticmethod
    def _key(setup: TrainingSetup, batch: int) -> tuple:
        # Liger's fused loss reads the GPU's compute capability (loss_kernels.liger_accumulate_bytes)
        return (batch, _FIELDS(setup), setup.gpu.compute_capability if setup.loss.fused else None)

    def record(self, setup: TrainingSetup, result: BudgetResult) -> None:
        """Remember one budget of ``setup`` (process per GPU)."""
        outside = result.components.get(MemCategory.OUTSIDE_PYTORCH, 0)
        self._outside[(setup.model.name, setup.gpu.name, setup.world_size)] = outside
        self._inside[self._key(setup, setup.batch)] = (result.per_gpu_peak_bytes - outside, result.host_ram_bytes)

    def floor(self, setup: TrainingSetup, batch: int | None = None) -> Floor | None:
        """The floors of ``setup`` (with micro-batch ``batch`` if given) on its GPU, or None when no twin was budgeted
        yet, or nothing was budgeted on this GPU and world size (its outside-PyTorch figure is not known)."""
        outside = self._outside.get((setup.model.name, setup.gpu.name, setup.world_size))
        if outside is None:
            return None
        twin = self._inside.get(self._key(setup, setup.batch if batch is None else batch))
        return None if twin is None else Floor(twin[0] + outside, twin[1])
