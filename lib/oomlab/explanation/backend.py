"""Which PyTorch backend wrote an out-of-memory message, and the words its allocator's story is told in.

Five allocators write one (the wording of each is quoted in :mod:`.message`):

* CUDA: ``c10/cuda/CUDACachingAllocator.cpp`` over ``cudaMalloc``;
* HIP: the same file, hipified for ROCm, over ``hipMalloc`` (same rounding, same figures);
* XPU: ``c10/xpu/XPUCachingAllocator.cpp`` over SYCL's ``aligned_alloc_device`` -- the same block sizes
  (512-byte blocks, 1 MiB small requests in 2 MiB segments, 20 MiB large buffers, 2 MiB rounding), so the
  request range holds for it too;
* MPS: ``aten/src/ATen/mps/MPSAllocator.mm``'s heap allocator over Metal heaps in unified memory -- its own
  figures (MPS allocated, other allocations, the high-watermark cap) and no CUDA-style segments;
* CPU: ``c10/core/impl/alloc_cpu.cpp``'s ``DefaultCPUAllocator`` -- one exact byte count and an errno.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Backend(enum.Enum):
    """The PyTorch device backend whose allocator wrote the message (the value is how the message names it)."""

    CUDA = "CUDA"  # NVIDIA GPUs: the CUDA caching allocator over cudaMalloc
    HIP = "HIP"  # AMD GPUs (ROCm): the same caching allocator, hipified, over hipMalloc
    XPU = "XPU"  # Intel GPUs: the XPU caching allocator over SYCL (Level Zero)
    MPS = "MPS"  # Apple silicon: the MPS heap allocator over Metal heaps in unified memory
    CPU = "CPU"  # host RAM: DefaultCPUAllocator (posix_memalign, _aligned_malloc on Windows)

    @property
    def article(self) -> str:
        """"a" or "an", as the name is read aloud: an MPS message, a HIP message."""
        return "an" if self in (Backend.MPS, Backend.XPU) else "a"

    @property
    def caching_allocator(self) -> bool:
        """Does the backend's allocator round requests into segments as CUDA's does (CUDA, HIP, XPU)?"""
        return self in CACHING_ALLOCATOR_BACKENDS


CACHING_ALLOCATOR_BACKENDS = frozenset({Backend.CUDA, Backend.HIP, Backend.XPU})


@dataclass(frozen=True)
class BackendTerms:
    """The names a verdict uses for one backend's runtime, allocator call and libraries."""

    device: str  # "NVIDIA GPU"
    malloc: str  # the call a segment is asked of: "cudaMalloc"
    context: str  # what a process holds outside the allocator at least: "a CUDA context"
    handles: str  # the library handles created with it
    libraries: str  # other holders of device memory inside the process
    graphs: str  # what private pools serve
    process_lister: str  # who lists the processes on the device
    alloc_conf: str  # the allocator's configuration variable


_TERMS = {
    Backend.CUDA: BackendTerms(
        "NVIDIA GPU", "cudaMalloc", "a CUDA context", "cuBLAS/cuDNN handles",
        "cuBLAS/cuDNN workspaces, NCCL buffers, other libraries", "CUDA Graphs", "NVML", "PYTORCH_CUDA_ALLOC_CONF"),
    Backend.HIP: BackendTerms(
        "AMD GPU (ROCm)", "hipMalloc", "a HIP runtime context", "rocBLAS/MIOpen handles",
        "rocBLAS/MIOpen workspaces, RCCL buffers, other libraries", "HIP Graphs", "the ROCm SMI library",
        "PYTORCH_HIP_ALLOC_CONF (or PYTORCH_CUDA_ALLOC_CONF)"),
    Backend.XPU: BackendTerms(
        "Intel GPU", "SYCL's aligned_alloc_device", "a Level Zero context", "oneDNN/oneMKL handles",
        "oneDNN/oneMKL workspaces, oneCCL buffers, other libraries", "XPU Graphs", "the Level Zero driver",
        "PYTORCH_XPU_ALLOC_CONF"),
    Backend.MPS: BackendTerms(
        "Apple silicon GPU", "a Metal heap", "the Metal device's own allocations", "-", "other Metal allocations",
        "-", "-", "PYTORCH_MPS_HIGH_WATERMARK_RATIO"),
    Backend.CPU: BackendTerms(
        "host (CPU)", "posix_memalign", "-", "-", "other host memory", "-", "-", "-"),
}


def backend_terms(backend: Backend | None) -> BackendTerms:
    """The words for ``backend``; an unnamed backend (the newest builds' plain "Out of memory") reads as CUDA."""
    return _TERMS[backend or Backend.CUDA]
