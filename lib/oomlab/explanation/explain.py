"""Explain an out-of-memory message the way an expert reads it, saying only what it supports.

``explain(text, model=..., gpu=..., dtype=...)`` decodes the message (:mod:`.message`: CUDA, ROCm/HIP, XPU, MPS or
the CPU allocator's) and its traceback (:mod:`.frames`), then:

* the request: "Tried to allocate" is the segment asked of cudaMalloc, so it names a range of request sizes,
  not one tensor size (:mod:`.request`);
* fragmentation (reserved − allocated) and whether the message's own hint can help;
* memory outside this process's allocator (total − free − reserved) against the range its GPU, torch era and world
  size should show -- the budget's own figure and the measured spread around it (:mod:`.outside`) -- and which
  listed process is this one (:mod:`.processes`);
* anomalies (allocated above capacity, a request above capacity, device ≠ 0, an ``allowed`` cap …:
  :mod:`.anomalies`);
* with a model: the parameter tensors and dtypes whose segment prints as the request, and, when the
  traceback shows ``Module._apply``, where the allocated figure falls along the ``_apply`` walk (:mod:`.candidates`);
  and the aggregates whose sizes match it -- whole copies per dtype, ZeRO partitions and FSDP shards over the world
  size, optimizer states, foreach temporaries, DDP and DeepSpeed buckets, the logits, dequantized weights -- ranked
  by the phase and what the caller told of the run (:mod:`.aggregate_candidates`);
* the torch releases whose ``module.py`` line numbers match the traceback (:mod:`.torch_versions`);
* the phase (moving, loading, forward, backward, optimizer step) the traceback's frames show (:mod:`.phase`);
* the next command to run, prefilled (:mod:`.next_step`).

MPS and CPU messages carry other figures (no segments, no device capacity): the request, the phase and the
backend's own figures are read; the CUDA-specific readings (segments, candidates, the ``_apply`` walk, GPU specs)
are not made.

The findings are data (:class:`~.findings.Findings`); the verdict is written from them (:mod:`.verdict`); an
:class:`Explanation` is both; :func:`oomlab.explanation.display.render_explanation` formats it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from oomlab.core.choices import Method, Optimizer, Strategy, choice
from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import GPUSpec, known_gpus, load_gpu
from oomlab.core.models import load_model
from oomlab.explanation.aggregate_candidates import AggregateCandidate, aggregate_candidates
from oomlab.explanation.anomalies import find_anomalies
from oomlab.explanation.backend import Backend
from oomlab.explanation.candidates import Candidate, tensor_candidates, walk_position
from oomlab.explanation.context import RunContext
from oomlab.explanation.findings import Findings
from oomlab.explanation.frames import parse_traceback
from oomlab.explanation.message import OomMessage, parse_oom_message, require_figure
from oomlab.explanation.next_step import next_step
from oomlab.explanation.outside import ExpectedOutside, expected_outside
from oomlab.explanation.phase import PhaseCode, detect_phase
from oomlab.explanation.printed import PrintedSize, interval_sub
from oomlab.explanation.processes import account_processes
from oomlab.explanation.request import request_range
from oomlab.explanation.torch_versions import match_torch_versions, observe_module_lines
from oomlab.explanation.verdict import compose_verdict


@dataclass(frozen=True)
class Explanation(Findings):
    """Everything ``oomlab explain`` says about one message: the findings and the verdict written from them."""

    verdict: str

    @classmethod
    def of(cls, findings: Findings, verdict: str) -> Explanation:
        return cls(**{f.name: getattr(findings, f.name) for f in fields(Findings)}, verdict=verdict)

    def to_dict(self) -> dict[str, Any]:
        step = next_step(self)
        return {**super().to_dict(), "verdict": self.verdict, "next_step": step.command,
                "next_step_unknown": list(step.unknown)}


def _gpu_matches(total: PrintedSize | None, backend: Backend | None) -> tuple[str, ...]:
    """Shipped GPUs whose capacity prints as ``total`` (NVIDIA specs only: none for another backend)."""
    if total is None or backend not in (None, Backend.CUDA):
        return ()
    return tuple(g for g in known_gpus() if total.low_bytes <= load_gpu(g).total_memory_bytes <= total.high_bytes)


def _count(value: int | None, name: str, what: str) -> int | None:
    """``value`` if a whole number ≥ 1 (or None); else an error naming it."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidValueError(f"invalid {name} {value!r}; expected a whole number of {what} >= 1, or None when "
                                "unknown")
    return value


def run_context(gpus: int | None = None, nodes: int | None = None, strategy: str | Strategy | None = None,
                method: str | Method | None = None, optimizer: str | Optimizer | None = None,
                batch: int | None = None, seq: int | None = None) -> RunContext:
    """What the caller told of the run, checked: counts are whole numbers ≥ 1, choices are known (the error lists
    them).  The world size is ``gpus`` × ``nodes`` (one node when not told); a ``single`` strategy is one GPU."""
    gpus, nodes = _count(gpus, "gpus", "GPUs"), _count(nodes, "nodes", "nodes")
    strat = choice(Strategy, strategy, "strategy") if strategy is not None else None
    world = gpus * (nodes or 1) if gpus is not None else (1 if strat is Strategy.SINGLE else None)
    return RunContext(
        world_size=world, strategy=strat,
        method=choice(Method, method, "method") if method is not None else None,
        optimizer=choice(Optimizer, optimizer, "optimizer") if optimizer is not None else None,
        batch=_count(batch, "batch", "sequences"), seq=_count(seq, "seq", "tokens"))


def explain(
    text: str | bytes, model: str | None = None, gpu: str | None = None, dtype: str | None = None,
    gpus: int | None = None, *, nodes: int | None = None, strategy: str | Strategy | None = None,
    method: str | Method | None = None, optimizer: str | Optimizer | None = None, batch: int | None = None,
    seq: int | None = None,
) -> Explanation:
    """Decode the out-of-memory message in ``text`` and say what it supports.

    Raises :class:`NotAnOomMessageError` (an :class:`~oomlab.core.errors.OomlabError`) when ``text`` holds none, or
    one from which no figure can be read: a bare ``CUDA out of memory.``, a message cut off before its first figure,
    or a garbled one (``Tried to allocate banana MiB (GPU x; total capacity;``) -- one rule, :func:`require_figure`
    -- and ``UnknownNameError`` for an unknown model, GPU, dtype, strategy, method or optimizer, and
    ``InvalidValueError`` for a ``gpus``, ``nodes``, ``batch`` or ``seq`` that is not a whole number ≥ 1 — all checked
    before any work.  What no message states -- ``gpus`` (GPUs per node) and ``nodes``, the ``strategy``, ``method``,
    ``optimizer``, micro-``batch`` and ``seq`` length -- fills in the next step's command and weighs the aggregate
    candidates (the world size divides partitions and shards; the memory outside PyTorch expects NCCL's buffers on
    more than one GPU).
    """
    spec = load_model(model) if model is not None else None
    gpu_spec = load_gpu(gpu) if gpu is not None else None
    dt = load_dtype(dtype).name if dtype is not None else None
    ctx = run_context(gpus, nodes, strategy, method, optimizer, batch, seq)
    msg = require_figure(parse_oom_message(text))
    frames, sources = parse_traceback(text)

    reserved = msg.reserved_low_high
    fragmentation = None
    if msg.reserved_unallocated is not None:
        fragmentation = (msg.reserved_unallocated.low_bytes, msg.reserved_unallocated.high_bytes)
    elif msg.reserved is not None and msg.allocated is not None:
        lo, hi = interval_sub(reserved, (msg.allocated.low_bytes, msg.allocated.high_bytes))
        fragmentation = (max(lo, 0), max(hi, 0))
    frag_bytes = None
    if msg.reserved_unallocated is not None:
        frag_bytes = msg.reserved_unallocated.value_bytes
    elif msg.reserved is not None and msg.allocated is not None:
        frag_bytes = max(msg.reserved.value_bytes - msg.allocated.value_bytes, 0)
    outside = outside_bytes = None
    if msg.total is not None and msg.free is not None and reserved is not None:
        outside = interval_sub(interval_sub((msg.total.low_bytes, msg.total.high_bytes),
                                              (msg.free.low_bytes, msg.free.high_bytes)), reserved)
        outside_bytes = msg.total.value_bytes - msg.free.value_bytes - (msg.reserved_bytes or 0)
    hint_can_help = None
    if fragmentation is not None and msg.tried is not None:
        if fragmentation[1] < msg.tried.low_bytes:
            hint_can_help = False
        elif fragmentation[0] >= msg.tried.high_bytes:
            hint_can_help = True

    gpu_matches = _gpu_matches(msg.total, msg.backend)
    caching = msg.backend is None or msg.backend.caching_allocator
    bf16 = gpu_spec.bf16 if gpu_spec is not None else (
        load_gpu(gpu_matches[0]).bf16 if len({load_gpu(g).bf16 for g in gpu_matches}) == 1 and gpu_matches else None)
    phase = detect_phase(frames)
    observations = observe_module_lines(frames, sources)
    versions = match_torch_versions(observations)

    walk = None
    candidates: tuple[Candidate, ...] = ()
    if spec is not None and caching:
        candidates = tensor_candidates(msg, spec.name, dt, bf16)
        if phase is not None and phase.code is PhaseCode.MOVE:
            replay = [dt] if dt else [c.dtype for c in candidates if c.dtype in ("float32", "float16", "bfloat16")]
            tried_dtypes = list(dict.fromkeys(replay or ["float16", "bfloat16", "float32"]))
            positions = [p for p in (walk_position(msg, spec.name, d, outside) for d in tried_dtypes) if p]
            exact = [p for p in positions if p.matched]
            walk = (exact or positions or [None])[0]
            if exact:
                candidates = tensor_candidates(msg, spec.name, dt, bf16, tuple(exact))

    request = _request_range(msg)
    aggregates: tuple[AggregateCandidate, ...] = ()
    if spec is not None and caching:
        aggregates = aggregate_candidates(request, spec.name, ctx, phase, frames)

    processes = account_processes(msg)
    expected = _expected_outside(msg, gpu_spec, gpu_matches, ctx)
    anomalies = tuple(find_anomalies(msg, outside, gpu_spec, processes, expected))
    findings = Findings(
        message=msg, model=spec.name if spec else None, gpu=gpu_spec.name if gpu_spec else None, dtype=dt,
        gpus=gpus, request_range=request, fragmentation=fragmentation, fragmentation_bytes=frag_bytes,
        outside=outside, outside_bytes=outside_bytes, expected_outside=expected, processes=processes,
        hint_can_help=hint_can_help, anomalies=anomalies, candidates=candidates, aggregates=aggregates, context=ctx,
        walk=walk, phase=phase, torch_versions=versions, version_observations=observations, gpu_matches=gpu_matches,
        frames=frames,
    )
    return Explanation.of(findings, compose_verdict(findings, gpu_spec))


def _expected_outside(msg: OomMessage, gpu_spec: GPUSpec | None, gpu_matches: tuple[str, ...],
                      ctx: RunContext) -> ExpectedOutside | None:
    """What the message's GPU should hold outside PyTorch: the GPU named, else those whose capacity prints as the
    message's total, else any shipped GPU; None for a backend oomlab has no figures for (ROCm, XPU)."""
    if msg.backend not in (None, Backend.CUDA):
        return None
    gpus = (gpu_spec,) if gpu_spec is not None else tuple(load_gpu(g) for g in gpu_matches)
    return expected_outside(gpus, ctx.world_size, msg.format)


def _request_range(msg: OomMessage) -> tuple[tuple[int, int], ...]:
    """The request sizes behind "Tried to allocate": a segment's range (caching allocators), exact (CPU), or unknown
    (MPS: Metal aligns a heap buffer to its own alignment, which the message does not print)."""
    if msg.tried is None or msg.backend is Backend.MPS:
        return ()
    if msg.backend is Backend.CPU:
        return ((msg.tried.low_bytes, msg.tried.high_bytes),)
    return request_range(msg.tried)
