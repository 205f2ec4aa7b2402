"""GPU specifications: memory as PyTorch reports it, throughput, host link and a citation per figure.

Shipped as ``specs/gpus/*.json`` and loaded into a frozen :class:`GPUSpec`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType

from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.paths import GPU_SPECS_DIR
from oomlab.core.user_input import shown


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: memory as PyTorch sees it, throughput, host link, and a source per figure."""

    name: str  # short name: "t4"
    display_name: str  # "Tesla T4"
    total_memory_bytes: int  # torch.cuda.get_device_properties().total_memory ("total capacity")
    nvidia_smi_total_mib: int  # nvidia-smi "Total" column
    compute_capability: tuple[int, int]
    bf16: bool  # native bfloat16 support (compute capability >= 8.0)
    peak_fp16_flops: float  # dense tensor-core FLOP/s
    peak_bf16_flops: float | None  # None without bf16
    peak_fp32_flops: float
    memory_bandwidth_bytes_per_s: int
    host_link: str  # "PCIe 3.0 x16"
    host_link_bytes_per_s: int  # per direction
    interconnect: str  # GPU to GPU: "NVLink 3 (SXM4) ..." or "PCIe only (...)"
    gpu_to_gpu_bytes_per_s: int  # per direction, theoretical
    sources: MappingProxyType = field(compare=False, repr=False)
    notes: str = field(default="", compare=False, repr=False)

    def __hash__(self) -> int:  # equal specs have equal names
        return hash(self.name)

    @property
    def nvlink(self) -> bool:
        """Are the GPUs of a node joined by NVLink (else PCIe)?"""
        return self.interconnect.startswith("NVLink")


def known_gpus() -> list[str]:
    """Names of the GPU specs shipped with oomlab."""
    return sorted(p.stem for p in GPU_SPECS_DIR.glob("*.json"))


_NAME = re.compile(r"[a-z0-9][a-z0-9_.+-]{0,63}")  # what a spec's file stem can be: no path separator, no ".."


@cache
def load_gpu(name: str) -> GPUSpec:
    """Load a shipped GPU spec by name (``t4``, ``a100-80gb`` ...).

    A GPU is a shipped spec's name only, never a path: ``/any/path.json`` or ``../models/llama-13b`` is refused
    naming the known GPUs and where a new spec goes (:data:`GPU_SPECS_DIR`).
    """
    key = str(name).strip().lower()
    known = known_gpus()
    if key not in known:
        if _NAME.fullmatch(key) and ".." not in key:
            raise UnknownNameError("GPU", name, known)
        raise InvalidValueError(
            f"GPU {shown(name)} is not a GPU name: a GPU is named by one of oomlab's specs, never by a path; known: "
            f"{', '.join(known)} (to add a GPU, write its spec as lib/oomlab/specs/gpus/<name>.json with the "
            "fields of t4.json, and pass <name>)")
    raw = json.loads((GPU_SPECS_DIR / f"{key}.json").read_text())
    return GPUSpec(
        name=raw["name"],
        display_name=raw["display_name"],
        total_memory_bytes=int(raw["total_memory_bytes"]),
        nvidia_smi_total_mib=int(raw["nvidia_smi_total_mib"]),
        compute_capability=tuple(raw["compute_capability"]),
        bf16=bool(raw["bf16"]),
        peak_fp16_flops=float(raw["peak_fp16_flops"]),
        peak_bf16_flops=None if raw["peak_bf16_flops"] is None else float(raw["peak_bf16_flops"]),
        peak_fp32_flops=float(raw["peak_fp32_flops"]),
        memory_bandwidth_bytes_per_s=int(raw["memory_bandwidth_bytes_per_s"]),
        host_link=raw["host_link"],
        host_link_bytes_per_s=int(raw["host_link_bytes_per_s"]),
        interconnect=str(raw["interconnect"]),
        gpu_to_gpu_bytes_per_s=int(raw["gpu_to_gpu_bytes_per_s"]),
        sources=MappingProxyType(dict(raw["sources"])),
        notes=raw.get("notes", ""),
    )
