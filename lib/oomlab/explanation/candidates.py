"""Which tensors of the model the message is about: shapes and dtypes whose segment prints as the request, and
where the allocated figure falls along the ``Module._apply`` walk."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from oomlab.core.models import load_model
from oomlab.core.units import format_size
from oomlab.explanation.message import OomMessage
from oomlab.explanation.printed import PrintedSize
from oomlab.explanation.request import segment_bytes
from oomlab.reproduction.walk import TensorKind, unlimited_walk

# Candidate storage types: (name, bits per element).  NB: 4-bit is bitsandbytes' packed uint8 (2 per byte).
CANDIDATE_DTYPES: tuple[tuple[str, float], ...] = (
    ("float32", 32), ("float16", 16), ("bfloat16", 16), ("int8", 8), ("4-bit", 4),
)


@dataclass(frozen=True)
class Candidate:
    """Tensors of one shape, in one dtype, whose cudaMalloc segment prints as the "Tried to allocate"."""

    rank: int  # 1 = best supported
    shape: tuple[int, ...]
    dtype: str  # "float16", "int8", "4-bit", or the buffer's own dtype
    kind: TensorKind
    tensor_bytes: int
    segment_bytes: int  # get_allocation_size(round_size(tensor_bytes))
    count: int  # tensors of this shape in the model
    names: tuple[str, ...]  # up to three of them
    roles: tuple[str, ...]  # their names with the layer index as N: "model.layers.N.mlp.gate_proj.weight"
    layers: tuple[int, ...]  # decoder layer indices they sit in
    evidence: tuple[str, ...]  # why this rank


@dataclass(frozen=True)
class WalkPosition:
    """Where the message's allocated figure falls along ``Module._apply``'s walk over the model."""

    dtype: str
    matched: bool  # True: tried, allocated (and reserved) all print as the message's at this tensor
    index: int  # position in the walk of the tensor being copied
    tensor: str
    shape: tuple[int, ...]
    tensor_bytes: int
    tried_bytes: int  # its segment
    layer: int | None  # decoder layer index (0-based), None outside the layers
    num_layers: int
    allocated_before_bytes: int
    reserved_before_bytes: int
    moved_parameters: int
    total_parameters: int
    model_bytes: int  # all tensors of the model in this dtype
    model_reserved_bytes: int  # what the allocator reserves for all of them
    usable_bytes: tuple[int, int] | None  # total capacity − memory outside PyTorch, as an interval
    fits: bool | None  # None when the figures cannot tell
    also_matching: int  # further walk positions that match as well

    @property
    def moved_fraction(self) -> float:
        return self.moved_parameters / self.total_parameters if self.total_parameters else 0.0


def _layer_of(name: str) -> int | None:
    m = re.search(r"\.layers?\.(\d+)\.", name) or re.search(r"\.h\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _roles(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(re.sub(r"\.(\d+)\.", ".N.", n) for n in names))


def tensor_candidates(
    msg: OomMessage, model: str, dtype: str | None = None, gpu_bf16: bool | None = None,
    walks: tuple[WalkPosition, ...] = (),
) -> tuple[Candidate, ...]:
    """Tensors of ``model`` (by shape) × dtypes whose segment prints as the message's "Tried to allocate".

    Ranked by the evidence for each: the dtype given, an ``_apply`` walk that reaches a tensor of that
    shape and dtype exactly at the message's figures, a GPU without bfloat16, parameter over buffer;
    ties keep the larger group first.
    """
    if msg.tried is None:
        return ()
    spec = load_model(model)
    steps = unlimited_walk(spec.name, "float16")
    low, high = msg.tried.low_bytes, msg.tried.high_bytes
    groups: dict[tuple[tuple[int, ...], str, TensorKind], list[Any]] = {}
    for step in steps:
        numel = math.prod(step.shape)
        options = ([(name, math.ceil(numel * bits / 8)) for name, bits in CANDIDATE_DTYPES]
                   if step.kind is TensorKind.PARAMETER else [(step.dtype, step.nbytes)])
        for dt, nbytes in options:
            if nbytes and low <= segment_bytes(nbytes) <= high:
                groups.setdefault((step.shape, dt, step.kind), []).append((step.name, nbytes))
    scored = []
    for (shape, dt, kind), members in groups.items():
        nbytes = members[0][1]
        score, evidence = 0, [f"a {' × '.join(map(str, shape))} {dt} tensor is {format_size(nbytes)}; its segment "
                                  f"prints as {format_size(segment_bytes(nbytes))}"]
        if dtype is not None and dt == dtype:
            score += 4
            evidence.append(f"{dt} is the dtype given")
        for walk in walks:
            if walk.matched and walk.dtype == dt and tuple(walk.shape) == shape:
                score += 8
                evidence.append(f"the _apply walk in {dt} reaches {walk.tensor} exactly at the message's figures")
        if dt == "bfloat16" and gpu_bf16 is False:
            score -= 1
            evidence.append("the GPU has no native bfloat16 (same bytes as float16: the sizes cannot tell them apart)")
        elif dt in ("float16", "bfloat16"):
            evidence.append("float16 and bfloat16 have the same size: the message cannot tell them apart")
        if kind is TensorKind.PARAMETER:
            score += 1
        names = tuple(n for n, _ in members)
        layers = tuple(sorted({lay for lay in map(_layer_of, names) if lay is not None}))
        scored.append((score, len(members), shape, dt, kind, nbytes, names, layers, tuple(evidence)))
    scored.sort(key=lambda s: (-s[0], -s[1], s[3], s[2]))
    return tuple(
        Candidate(rank=i + 1, shape=shape, dtype=dt, kind=kind, tensor_bytes=nbytes,
                  segment_bytes=segment_bytes(nbytes),
                  count=len(names), names=names[:3], roles=_roles(names), layers=layers, evidence=evidence)
        for i, (_, _, shape, dt, kind, nbytes, names, layers, evidence) in enumerate(scored)
    )


def _contains(size: PrintedSize | None, value: int) -> bool:
    return size is None or size.low_bytes <= value <= size.high_bytes


def walk_position(msg: OomMessage, model: str, dtype: str, outside: tuple[int, int] | None) -> WalkPosition | None:
    """Replay ``model.to('cuda')`` in ``dtype`` on an unlimited device; find the copy the message describes.

    A position matches when the tensor's segment prints as the "Tried to allocate" and the allocated
    (and reserved) figures just before it print as the message's.  Without an exact match, the position
    where the allocated figure is first exceeded is returned with ``matched=False``.
    """
    if msg.allocated is None:
        return None
    spec = load_model(model)
    steps = unlimited_walk(spec.name, dtype)
    if not steps:
        return None
    reserved = msg.reserved_low_high
    matches = []
    for i, step in enumerate(steps):
        before_alloc = steps[i - 1].allocated_bytes if i else 0
        before_res = steps[i - 1].reserved_bytes if i else 0
        if not (_contains(msg.tried, step.tried_bytes) and _contains(msg.allocated, before_alloc)):
            continue
        if reserved is not None and not reserved[0] <= before_res <= reserved[1]:
            continue
        matches.append(i)
    matched = bool(matches)
    if matched:
        index = matches[0]
    else:
        over = [i for i, s in enumerate(steps) if s.allocated_bytes > msg.allocated.high_bytes]
        if not over:
            return None
        index = over[0]
    step = steps[index]
    before = steps[index - 1] if index else None
    last = steps[-1]
    usable = None
    fits = None
    if msg.total is not None and outside is not None:
        usable = (msg.total.low_bytes - max(outside[1], 0), msg.total.high_bytes - max(outside[0], 0))
        fits = True if last.reserved_bytes <= usable[0] else False if last.reserved_bytes > usable[1] else None
    elif msg.total is not None:
        fits = False if last.reserved_bytes > msg.total.high_bytes else None
    return WalkPosition(
        dtype=dtype, matched=matched, index=index, tensor=step.name, shape=tuple(step.shape),
        tensor_bytes=step.nbytes, tried_bytes=step.tried_bytes, layer=_layer_of(step.name),
        num_layers=spec.num_hidden_layers,
        allocated_before_bytes=before.allocated_bytes if before else 0,
        reserved_before_bytes=before.reserved_bytes if before else 0,
        moved_parameters=before.moved_parameters if before else 0, total_parameters=last.moved_parameters,
        model_bytes=last.moved_bytes, model_reserved_bytes=last.reserved_bytes, usable_bytes=usable, fits=fits,
        also_matching=max(0, len(matches) - 1),
    )
