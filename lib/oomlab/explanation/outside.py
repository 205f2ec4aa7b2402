"""How much memory outside PyTorch a message should show on its GPU: the budget's own figure and the range around it.

The budget subtracts :func:`oomlab.core.outside.outside_memory` from each GPU (the CUDA context of the torch era, plus
NCCL's buffers in a multi-GPU job).  Those figures are the recommended points of ``specs/outside-memory.json``, which
also records the spread each was chosen from (``range_bytes``: the measured contexts and the total − free − reserved
of real OOM messages on that GPU generation, and NCCL's measured buffers).  That spread is the stated tolerance: a
message's total − free − reserved within the range of its GPU, era and world size is what a training process holds
(the budget's 1.19 GiB for a V100 rank of a multi-GPU job sits in 864 MiB – 2.17 GiB, so 1.5 GiB is expected, not
an anomaly); only above the range's top is it remarked on.  NB: the range's top, not a multiple of the point: the
measured spread is lopsided (a V100's context was seen from 352 MiB to 1.17 GiB), so a relative tolerance around
the point would flag measured cases and pass impossible ones.

Which figures apply: the GPU named, else the shipped GPUs whose capacity prints as the message's total (a GPU without
its own figure takes its generation's, as :mod:`oomlab.core.outside` does), else the widest range of every shipped
GPU; the era the message's format shows (torch ≤ 2.0 or ≥ 2.1), else both; NCCL's add-on when the world size given
is above one (its NVLink or PCIe figure, and up to 2.25 GiB more of NVLS buffers on Hopper with more than two GPUs).
Without a world size the single process's range is used -- a message names one GPU -- and the multi-GPU range is
reported beside it.  Other backends (ROCm, XPU) have no shipped figures: :data:`LEGACY_CONTEXT_BYTES` applies.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from oomlab.core.choices import MessageFormat
from oomlab.core.gpus import GPUSpec
from oomlab.core.outside import OUTSIDE_MEMORY, SAME_GENERATION, TorchEra, outside_memory
from oomlab.core.size_ranges import format_interval
from oomlab.core.units import GiB, MiB, format_size

LEGACY_CONTEXT_BYTES = (300 * MiB, 600 * MiB)  # NB: another backend's context and handles: no shipped figure
LEGACY_FLAG_BYTES = 1 * GiB  # another backend: remarked on above this
HOPPER = (9, 0)
ASSUMED_WORLD_SIZE = 8  # the multi-GPU range reported beside a single process's: a node of 8 (NVLS on Hopper)

# the era's key in specs/outside-memory.json (the same keys core.outside reads)
_ERA_KEYS = {TorchEra.NEW: "era_new_torch_ge_2_1", TorchEra.OLD: "era_old_torch_le_2_0"}


class OutsideReading(enum.Enum):
    """Where a message's memory outside PyTorch falls against the expected range."""

    BELOW = "below"  # under the range: fewer kernels loaded so far (OOM snapshots are lower bounds)
    WITHIN = "within"  # what a training process holds
    ABOVE = "above"  # more than the range: another process, or every rank's context on one GPU


@dataclass(frozen=True)
class ExpectedOutside:
    """The memory outside PyTorch expected on the message's GPU: the range, the budget's figure and their basis."""

    low_bytes: int
    high_bytes: int
    budget_bytes: int | None  # the budget's figure (core.outside.outside_memory); None unless one GPU and era apply
    basis: str  # "on a V100-32GB under torch>=2.1, with NCCL for 8 GPUs"
    parts: str  # "CUDA context 352.00 MiB – 1.17 GiB + NCCL 512.00 MiB – 1.00 GiB"
    nccl: bool  # NCCL's buffers are part of it
    multi_gpu: tuple[int, int] | None  # with the world size not given: the range of one rank of a multi-GPU job

    @property
    def interval(self) -> tuple[int, int]:
        return self.low_bytes, self.high_bytes

    def reading(self, observed: tuple[int, int]) -> OutsideReading:
        """``observed`` (an interval) against the range: above only when all of it is above."""
        if observed[0] > self.high_bytes:
            return OutsideReading.ABOVE
        return OutsideReading.BELOW if observed[1] < self.low_bytes else OutsideReading.WITHIN


@cache
def _data() -> dict[str, Any]:
    return json.loads(OUTSIDE_MEMORY.read_text())["recommended_defaults"]


def _eras(fmt: MessageFormat | None) -> tuple[TorchEra, ...]:
    return (TorchEra(fmt.value),) if fmt is not None else (TorchEra.NEW, TorchEra.OLD)


def _gpu_key(gpu: GPUSpec, per_gpu: dict[str, Any]) -> str:
    """The figure's GPU: its own, else its generation's (as :func:`oomlab.core.outside.outside_memory` picks)."""
    return gpu.name if gpu.name in per_gpu else SAME_GENERATION.get(tuple(gpu.compute_capability), "a100-80gb")


def _context_ranges(gpus: tuple[GPUSpec, ...], eras: tuple[TorchEra, ...]) -> list[tuple[int, int]]:
    out = []
    for era in eras:
        per_gpu = _data()[_ERA_KEYS[era]]["per_gpu"]
        entries = [per_gpu[_gpu_key(g, per_gpu)] for g in gpus] if gpus else list(per_gpu.values())
        out += [(int(e["range_bytes"][0]), int(e["range_bytes"][1])) for e in entries]
    return out


def _nccl_range(gpus: tuple[GPUSpec, ...], world_size: int) -> tuple[int, int]:
    add = _data()["nccl_addon_per_gpu"]
    links = {g.nvlink for g in gpus} if gpus else {True, False}
    ranges = [add["nvlink_or_nvswitch_one_communicator" if nvlink else "pcie_only_one_communicator"]["range_bytes"]
              for nvlink in links]
    low, high = min(int(r[0]) for r in ranges), max(int(r[1]) for r in ranges)
    if world_size > 2 and (not gpus or any(g.nvlink and tuple(g.compute_capability) == HOPPER for g in gpus)):
        high += int(add["hopper_nvls_extra"]["bytes"])  # NB: NVLS buffers, 0 with NCCL_NVLS_ENABLE=0
    return low, high


def expected_outside(gpus: tuple[GPUSpec, ...], world_size: int | None,
                     fmt: MessageFormat | None) -> ExpectedOutside:
    """The range of memory outside PyTorch for one training process on ``gpus`` (any of them; every shipped GPU when
    empty) under the era of ``fmt`` (both when None), with NCCL when ``world_size`` > 1."""
    eras = _eras(fmt)
    contexts = _context_ranges(gpus, eras)
    context = (min(lo for lo, _ in contexts), max(hi for _, hi in contexts))
    nccl = world_size is not None and world_size > 1
    low, high = context
    parts = f"CUDA context {format_interval(context)}"
    if nccl:
        n_low, n_high = _nccl_range(gpus, world_size)
        low, high = low + n_low, high + n_high
        parts += f" + NCCL {format_interval((n_low, n_high))}"
    multi = None
    if world_size is None:
        n_low, n_high = _nccl_range(gpus, ASSUMED_WORLD_SIZE)
        multi = (context[0] + n_low, context[1] + n_high)
    budget = None
    if len(gpus) == 1 and len(eras) == 1:
        budget = outside_memory(gpus[0], world_size or 1, eras[0]).total_bytes
    where = ("the " + " or ".join(g.name for g in gpus) if gpus
             else "an unnamed GPU (the widest range of every shipped GPU)")
    era = eras[0].value if len(eras) == 1 else "either torch era"
    basis = f"on {where} under {era}" + (f", with NCCL for {world_size} GPUs" if nccl else "")
    return ExpectedOutside(low_bytes=low, high_bytes=high, budget_bytes=budget, basis=basis, parts=parts, nccl=nccl,
                           multi_gpu=multi)


def describe_expected(e: ExpectedOutside) -> str:
    """``864.00 MiB – 2.17 GiB expected on a V100-32GB under torch>=2.1, with NCCL for 8 GPUs (CUDA context … + NCCL
    …; oomlab's budget counts 1.19 GiB)``."""
    budget = f"; oomlab's budget counts {format_size(e.budget_bytes)}" if e.budget_bytes is not None else ""
    return f"{format_interval(e.interval)} expected {e.basis} ({e.parts}{budget})"
