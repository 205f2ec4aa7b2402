"""What ``oomlab explain`` reads off a message: the figures' intervals, the request, fragmentation, memory outside
PyTorch against what its GPU should show, which listed process is this one, anomalies, tensor and aggregate candidates,
the ``_apply`` walk position, the phase and the torch releases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.explanation.aggregate_candidates import AggregateCandidate
from oomlab.explanation.anomalies import Anomaly
from oomlab.explanation.candidates import Candidate, WalkPosition
from oomlab.explanation.context import RunContext
from oomlab.explanation.frames import Frame
from oomlab.explanation.message import OomMessage
from oomlab.explanation.outside import ExpectedOutside
from oomlab.explanation.phase import TracebackPhase
from oomlab.explanation.printed import PrintedSize
from oomlab.explanation.processes import ProcessAccount


@dataclass(frozen=True)
class Findings:
    """Everything ``oomlab explain`` reads off one message, before the verdict is written."""

    message: OomMessage
    model: str | None
    gpu: str | None
    dtype: str | None
    gpus: int | None  # GPUs per node, when the caller knows it (a message names one GPU, never how many)
    request_range: tuple[tuple[int, int], ...]  # tensor sizes (bytes, inclusive) that give the "Tried to allocate"
    fragmentation: tuple[int, int] | None  # reserved − allocated, as an interval
    fragmentation_bytes: int | None
    outside: tuple[int, int] | None  # total − free − reserved, as an interval
    outside_bytes: int | None
    expected_outside: ExpectedOutside | None  # what the GPU should hold outside PyTorch (None: another backend)
    processes: ProcessAccount  # which listed process is this one; its memory in use and outside PyTorch
    hint_can_help: bool | None  # whether max_split_size_mb / expandable_segments can help (None: cannot tell)
    anomalies: tuple[Anomaly, ...]
    candidates: tuple[Candidate, ...]
    aggregates: tuple[AggregateCandidate, ...]  # whole copies, partitions, states, buckets, logits ... that match
    context: RunContext  # what the caller told about the run (world size, strategy, method, batch, seq)
    walk: WalkPosition | None
    phase: TracebackPhase | None
    torch_versions: tuple[str, ...]
    version_observations: tuple[tuple[str, int], ...]  # (anchor, line) pairs read from the traceback
    gpu_matches: tuple[str, ...]  # shipped GPUs whose capacity prints as the message's total
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every figure in bytes with its ``*_interval`` ([low, high], inclusive)."""
        m = self.message
        data: dict[str, Any] = {"format": m.format.value if m.format else None,
                                "backend": m.backend.value if m.backend else None, "device_index": m.device_index}

        def put(key: str, size: PrintedSize | None) -> None:
            data[f"{key}_bytes"] = None if size is None else size.value_bytes
            data[f"{key}_interval"] = None if size is None else size.interval
            data[f"{key}_printed"] = None if size is None else size.text

        put("tried", m.tried)
        put("total", m.total)
        put("free", m.free)
        put("allocated", m.allocated)
        put("in_use", m.in_use)
        put("reserved_unallocated", m.reserved_unallocated)
        put("private_pools", m.private_pools)
        put("reserved", m.reserved)
        if m.reserved is None:  # new format: reserved = allocated + reserved-but-unallocated
            reserved = m.reserved_low_high
            data["reserved_bytes"] = m.reserved_bytes
            data["reserved_interval"] = list(reserved) if reserved else None
        data["reserved_derived"] = m.reserved is None and m.reserved_bytes is not None
        put("allowed", m.allowed)
        data["processes"] = [{"pid": p.pid, "bytes": p.memory.value_bytes, "interval": p.memory.interval,
                              "printed": p.memory.text} for p in m.processes]
        acc = self.processes
        data["this_process"] = None if acc.in_use is None else {
            "pid": acc.pid, "basis": acc.basis.value if acc.basis else None, "in_use_bytes": acc.in_use.value_bytes,
            "in_use_interval": acc.in_use.interval, "in_use_printed": acc.in_use.text}
        data["this_process_candidates"] = [p.pid for p in acc.candidates]
        data["ambiguous_figures"] = list(acc.ambiguous)
        mps = m.mps
        for key in ("mps_allocated", "other_allocations", "max_allowed"):
            put(key, None if mps is None else getattr(mps, key.removeprefix("mps_")))
        data["pool"] = None if mps is None else mps.pool
        data["host_error"] = None if m.host is None else {"code": m.host.code, "reason": m.host.reason}
        data["missing"] = list(m.missing)
        data["unreadable"] = [{"figure": u.name, "text": u.text} for u in m.unreadable]
        data["hint"] = m.hint
        data["hint_can_help"] = self.hint_can_help
        data["request_range"] = [list(r) for r in self.request_range]
        data["fragmentation_bytes"] = self.fragmentation_bytes
        data["fragmentation_interval"] = list(self.fragmentation) if self.fragmentation else None
        data["outside_pytorch_bytes"] = self.outside_bytes
        data["outside_pytorch_interval"] = list(self.outside) if self.outside else None
        data["non_pytorch_this_process_interval"] = list(acc.non_pytorch) if acc.non_pytorch else None
        data["other_processes_interval"] = list(acc.other_processes) if acc.other_processes else None
        data["anomalies"] = [{"code": a.code.value, "text": a.text} for a in self.anomalies]
        data["model"], data["gpu"], data["dtype"], data["gpus"] = self.model, self.gpu, self.dtype, self.gpus
        data["gpu_matches"] = list(self.gpu_matches)
        data["candidates"] = [
            {"rank": c.rank, "shape": list(c.shape), "dtype": c.dtype, "kind": c.kind.value,
             "tensor_bytes": c.tensor_bytes, "segment_bytes": c.segment_bytes, "count": c.count,
             "names": list(c.names), "roles": list(c.roles), "layers": list(c.layers), "evidence": list(c.evidence)}
            for c in self.candidates
        ]
        data["aggregates"] = [
            {"rank": c.rank, "kind": c.aggregate.kind.value, "what": c.aggregate.what,
             "arithmetic": c.aggregate.arithmetic, "bytes": c.aggregate.nbytes, "span": list(c.aggregate.span),
             "exact": c.exact, "in_phase": c.in_phase, "solved": c.aggregate.solved, "where": c.aggregate.where,
             "evidence": list(c.evidence)}
            for c in self.aggregates
        ]
        ctx = self.context
        data["context"] = {"world_size": ctx.world_size, "strategy": ctx.strategy and ctx.strategy.value,
                           "method": ctx.method and ctx.method.value,
                           "optimizer": ctx.optimizer and ctx.optimizer.value, "batch": ctx.batch, "seq": ctx.seq}
        x = self.expected_outside
        data["expected_outside"] = None if x is None else {
            "interval": list(x.interval), "budget_bytes": x.budget_bytes, "basis": x.basis, "parts": x.parts,
            "multi_gpu_interval": list(x.multi_gpu) if x.multi_gpu else None,
            "reading": None if self.outside is None else x.reading(self.outside).value}
        w = self.walk
        data["walk"] = None if w is None else {
            "dtype": w.dtype, "matched": w.matched, "index": w.index, "tensor": w.tensor, "shape": list(w.shape),
            "tensor_bytes": w.tensor_bytes, "tried_bytes": w.tried_bytes, "layer": w.layer,
            "num_layers": w.num_layers, "allocated_before_bytes": w.allocated_before_bytes,
            "reserved_before_bytes": w.reserved_before_bytes, "moved_parameters": w.moved_parameters,
            "total_parameters": w.total_parameters, "moved_fraction": w.moved_fraction,
            "model_bytes": w.model_bytes, "model_reserved_bytes": w.model_reserved_bytes,
            "usable_interval": list(w.usable_bytes) if w.usable_bytes else None, "fits": w.fits,
            "also_matching": w.also_matching,
        }
        data["phase"] = None if self.phase is None else {
            "code": self.phase.code.value, "text": self.phase.text, "evidence": list(self.phase.evidence)}
        data["torch_versions"] = list(self.torch_versions)
        data["torch_version_evidence"] = [f"module.py:{line} {anchor}" for anchor, line in self.version_observations]
        data["occurrences"] = m.occurrences
        data["scanned_tail"] = m.scanned_tail
        data["message"] = m.message
        return data
