"""Which of the processes a message lists is this one, and what follows for the memory outside PyTorch.

torch ≥ 2.1 asks the driver (NVML) for the processes on the device and prints each as ``Process PID has U memory
in use``, except the one whose PID equals its own ``getpid()``, printed ``Including non-PyTorch memory, this
process has U memory in use`` (``reportProcessMemoryInfo`` in ``c10/cuda/CUDACachingAllocator.cpp``).  In a
container the driver reports host PIDs, so this process too is printed as ``Process PID``.  Then:

* exactly one ``Process`` line and no ``this process`` line: the one listed is this process (it holds at least a
  context and its reserved memory, so the driver lists it) -- its memory in use is this process's;
* several and no ``this process`` line: this process is one of those holding at least its reserved memory; when
  only one does, it is that one, otherwise its memory in use, its memory outside PyTorch and the other processes'
  share are ambiguous (the total outside this allocator, total − free − reserved, is not).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from oomlab.explanation.message import OomMessage, ProcessMemory
from oomlab.explanation.printed import PrintedSize, interval_sub


class ProcessBasis(enum.Enum):
    """How this process was told among the processes the message lists."""

    NAMED = "named"  # "Including non-PyTorch memory, this process has U memory in use"
    ONLY_ONE_LISTED = "only-one-listed"  # one "Process PID" line and no "this process" line: a container's host PID
    ONLY_ONE_LARGE_ENOUGH = "only-one-large-enough"  # several listed; one alone holds at least the reserved memory


@dataclass(frozen=True)
class ProcessAccount:
    """This process's memory in use and the other processes', from the message's process lines."""

    in_use: PrintedSize | None  # this process's memory in use, non-PyTorch memory included
    pid: int | None  # its PID as listed (None when named "this process", or not told)
    basis: ProcessBasis | None  # None: no process lines, or this process cannot be told among them
    others: tuple[ProcessMemory, ...]  # listed processes that are not this one
    candidates: tuple[ProcessMemory, ...]  # several listed, this one not told: those it may be
    non_pytorch: tuple[int, int] | None  # this process's memory outside PyTorch's allocator: in use − reserved
    other_processes: tuple[int, int] | None  # held by other processes: total − free − in use
    ambiguous: tuple[str, ...]  # the figures that cannot be told: "in_use", "non_pytorch", "other_processes"

    @property
    def listed(self) -> int:
        """How many processes the message lists, this one included."""
        return len(self.others) + len(self.candidates) + (self.in_use is not None)


def _clamped(iv: tuple[int, int]) -> tuple[int, int]:
    return max(iv[0], 0), max(iv[1], 0)


def account_processes(msg: OomMessage) -> ProcessAccount:
    """Tell this process among the listed ones; derive its memory outside PyTorch and the other processes'."""
    processes, reserved = msg.processes, msg.reserved_low_high
    own: ProcessMemory | None = None
    basis: ProcessBasis | None = None
    candidates: tuple[ProcessMemory, ...] = ()
    if msg.in_use is not None:
        basis = ProcessBasis.NAMED
    elif len(processes) == 1 and (reserved is None or processes[0].memory.high_bytes >= reserved[0]):
        own, basis = processes[0], ProcessBasis.ONLY_ONE_LISTED
    elif len(processes) > 1:
        large = tuple(p for p in processes if reserved is None or p.memory.high_bytes >= reserved[0])
        if len(large) == 1 and reserved is not None:
            own, basis = large[0], ProcessBasis.ONLY_ONE_LARGE_ENOUGH
        else:
            candidates = large or processes
    in_use = msg.in_use if msg.in_use is not None else own.memory if own is not None else None
    others = tuple(p for p in processes if p is not own and p not in candidates)
    non_pytorch = other_processes = None
    if in_use is not None and reserved is not None:
        non_pytorch = _clamped(interval_sub((in_use.low_bytes, in_use.high_bytes), reserved))
    if in_use is not None and msg.total is not None and msg.free is not None:
        used = interval_sub((msg.total.low_bytes, msg.total.high_bytes), (msg.free.low_bytes, msg.free.high_bytes))
        other_processes = _clamped(interval_sub(used, (in_use.low_bytes, in_use.high_bytes)))
    ambiguous = ("in_use", "non_pytorch", "other_processes") if candidates else ()
    return ProcessAccount(in_use=in_use, pid=own.pid if own is not None else None, basis=basis, others=others,
                          candidates=candidates, non_pytorch=non_pytorch, other_processes=other_processes,
                          ambiguous=ambiguous)
