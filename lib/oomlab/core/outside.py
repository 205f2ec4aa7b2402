"""Memory on a GPU outside PyTorch's caching allocator (what nvidia-smi counts and ``memory_reserved`` does not): the
CUDA context with its kernel images, and NCCL's buffers in a multi-GPU job.

The figures are data (``specs/outside-memory.json``: each with its basis, range and provenance -- measured, derived
from real OOM messages as total − free − reserved, or assumed).  They depend on the torch era more than on the GPU:
lazy module loading (torch >= 1.13, CUDA >= 11.7, and CUDA 12 wheels) cut the context two- to fourfold, so a torch
<= 2.0 run (the old message format) gets the old era's figure.  The cuBLAS and cuDNN workspaces are inside
``memory_reserved`` (PyTorch allocates them through its caching allocator) and so are not counted here.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from oomlab.core.gpus import GPUSpec
from oomlab.core.paths import SPECS_DIR
from oomlab.core.units import format_size

OUTSIDE_MEMORY = SPECS_DIR / "outside-memory.json"
# GPUs without a figure of their own take the figure of a measured GPU of the same generation (compute capability).
SAME_GENERATION = {(7, 0): "v100-32gb", (7, 5): "t4", (8, 0): "a100-80gb", (8, 6): "a10g", (8, 9): "l4",
                   (9, 0): "h100-80gb"}


class TorchEra(enum.Enum):
    """Which PyTorch the job runs, as far as memory outside PyTorch is concerned."""

    NEW = "torch>=2.1"  # lazy module loading in effect (the new OOM message format)
    OLD = "torch<=2.0"  # CUDA 10/11 wheels, eager library images (the old OOM message format)


_ERA_KEYS = {TorchEra.NEW: "era_new_torch_ge_2_1", TorchEra.OLD: "era_old_torch_le_2_0"}


@dataclass(frozen=True)
class OutsideMemory:
    """Bytes held outside PyTorch on one GPU, and where the figure comes from."""

    context_bytes: int
    nccl_bytes: int
    source: str  # one sentence: the basis of each part, with its provenance

    @property
    def total_bytes(self) -> int:
        return self.context_bytes + self.nccl_bytes


@cache
def _data() -> dict[str, Any]:
    return json.loads(OUTSIDE_MEMORY.read_text())


def outside_memory(gpu: GPUSpec, world_size: int = 1, era: TorchEra = TorchEra.NEW) -> OutsideMemory:
    """The shipped figure for one training process per GPU on ``gpu``, ``world_size`` processes in all."""
    defaults = _data()["recommended_defaults"]
    per_gpu = defaults[_ERA_KEYS[era]]["per_gpu"]
    key, borrowed = gpu.name, ""
    if key not in per_gpu:
        key = SAME_GENERATION.get(tuple(gpu.compute_capability), "a100-80gb")
        borrowed = f" (no {gpu.display_name} figure: that of the {key}, the same generation; assumed)"
    context = per_gpu[key]
    parts = [f"CUDA context {format_size(context['bytes'])} for {era.value} on the {key}{borrowed}: "
             f"{context['basis']} [{context['provenance']}]"]
    nccl = 0
    if world_size > 1:
        add = defaults["nccl_addon_per_gpu"]["nvlink_or_nvswitch_one_communicator" if gpu.nvlink
                                             else "pcie_only_one_communicator"]
        nccl = int(add["bytes"])
        parts.append(f"NCCL {format_size(nccl)} for one communicator over "
                     f"{'NVLink' if gpu.nvlink else 'PCIe'}: {add['basis']} [{add['provenance']}]")
    return OutsideMemory(int(context["bytes"]), nccl, "; ".join(parts))
