"""Aggregates: one request that holds many parameters (or tokens) at once -- a whole copy of the model, a partition of
it, an optimizer state of a flat parameter, a gradient bucket, the logits -- as the frameworks allocate them.

The vocabulary the catalogues (:mod:`.model_copies`, :mod:`.buckets`, :mod:`.logits`) share: what kind of request
each is (:class:`AggregateKind`), one sized aggregate with its arithmetic and where it is allocated
(:class:`Aggregate`), and the model's parameters as the built model registers them (:class:`ParameterInventory`,
from the reproduction's weightless ``_apply`` walk, so nothing is counted twice and tied weights once).

The tolerance policy (one rule, :meth:`Aggregate.matches`): an aggregate is not one size but the interval of request
sizes its mechanism can produce -- the nominal arithmetic, widened only by what that mechanism really does (the
Trainer's parameter groups, DeepSpeed's and FSDP's padding, whole parameters straddling a partition's ends).  It
matches a message when that interval meets the request range of the "Tried to allocate" figure (the segment's
inverse, :func:`oomlab.explanation.request.request_range`: a printed X ≥ 10 MiB is a request in (X − 2 MiB, X]);
it is *exact* when its nominal figure itself lies in that range -- the single-tensor rule of :mod:`.candidates`.
No further relative tolerance: the sizes are arithmetic on the model spec, not estimates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from oomlab.core.choices import Choice, Method, Optimizer, Strategy
from oomlab.core.models import load_model
from oomlab.explanation.phase import PhaseCode
from oomlab.reproduction.walk import TensorKind, unlimited_walk

# Storage types of whole copies: (name, bits per element).  NB: 4-bit is bitsandbytes' packed uint8, two per byte;
# NF4's block scales (absmax, 4.127 bits with double quantization) are separate tensors, not in the request.
COPY_DTYPES: tuple[tuple[str, float], ...] = (("fp32", 32), ("bf16/fp16", 16), ("int8", 8), ("4-bit", 4))

# World sizes tried when the caller gave none: powers of two only (GPUs per node 2, 4 or 8, times a power-of-two
# node count) -- every integer would match something for almost any request (see ``solved``).
SOLVED_WORLD_SIZES: tuple[int, ...] = tuple(2**k for k in range(1, 10))

ZERO = frozenset({Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD})
ZERO_ON_GPU = frozenset({Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3})  # the optimizer step on the GPU
FSDP = frozenset({Strategy.FSDP, Strategy.FSDP_OFFLOAD, Strategy.FSDP2, Strategy.FSDP2_OFFLOAD})
FSDP_ON_GPU = frozenset({Strategy.FSDP, Strategy.FSDP2})
FULL_TRAINING = frozenset({Method.FULL})  # states of every parameter: not LoRA's adapters only
ADAM = frozenset({Optimizer.ADAMW, Optimizer.ADAMW_FUSED, Optimizer.ADAMW_HF})  # two full-precision moments


class AggregateKind(Choice):
    """What one aggregate request is, by the mechanism that allocates it."""

    WHOLE_COPY = "whole-copy"  # every parameter in one dtype as one flat buffer (a flattening, a flat checkpoint)
    GRADIENT_PARTITION = "gradient-partition"  # ZeRO's gradients of this rank's partition (fp32 in the step)
    MOMENT = "moment"  # one optimizer moment (Adam's exp_avg or exp_avg_sq, SGD's momentum) of a flat parameter
    FOREACH_TEMPORARY = "foreach-temporary"  # torch's foreach AdamW: a state-sized sqrt temporary of a flat parameter
    STATE_8BIT = "state-8bit"  # one bitsandbytes 8-bit moment of a flat parameter (one byte per element)
    MOMENTS = "moments"  # both Adam moments as one tensor: a gathered or loaded flat state, never a step's
    MASTER_PARTITION = "master-partition"  # ZeRO's fp32 master weights of this rank, made in deepspeed.initialize
    FLAT_SHARD = "flat-shard"  # FSDP's flat parameter of the whole model (no wrap policy), this rank's 1/W shard
    UNIT_FLAT = "unit-flat"  # an FSDP unit's flat parameter unsharded: what FSDP all-gathers (a decoder layer ...)
    UNIT_SHARD = "unit-shard"  # an FSDP unit's flat parameter, this rank's 1/W shard
    DDP_BUCKET = "ddp-bucket"  # a DistributedDataParallel gradient bucket (25 MiB cap; everything at first)
    REDUCE_BUCKET = "reduce-bucket"  # DeepSpeed's reduce bucket (the ipg buffer): reduce_bucket_size elements
    LOGITS = "logits"  # the LM head's output, batch × seq × vocab in the compute dtype
    LOGITS_FP32 = "logits-fp32"  # the logits upcast to fp32 for the loss, their log-softmax, or their gradient
    DEQUANTIZED = "dequantized"  # a 4-bit nn.Linear's weight dequantized to half for its matmul (QLoRA)


@dataclass(frozen=True)
class Aggregate:
    """One aggregate request of a model: its size, its arithmetic, and what allocates it, where and when."""

    kind: AggregateKind
    what: str  # "a whole fp32 copy of the model", "ZeRO's fp32 gradient partition over 8 GPUs"
    arithmetic: str  # "6.74B parameters × 4 bytes / 8 GPUs = 3.14 GiB"
    nbytes: int  # the nominal size
    span: tuple[int, int]  # the request sizes the mechanism can produce (inclusive): the tolerance
    where: str  # the allocation site, with its source file
    phases: frozenset[PhaseCode]  # the traceback phases it is allocated in (empty: at setup, in no step phase)
    strategies: frozenset[Strategy] | None = None  # the launches that allocate it (None: any)
    methods: frozenset[Method] | None = None  # None: any
    optimizers: frozenset[Optimizer] | None = None  # None: any
    solved: str | None = None  # what it assumes, not given but solved from the request: "the job has 8 GPUs"
    span_note: str | None = None  # what widens the span beyond the nominal figure

    def matches(self, request: tuple[tuple[int, int], ...]) -> bool:
        """Whether some request size it can produce has a segment that prints as the message's."""
        return any(lo <= self.span[1] and self.span[0] <= hi for lo, hi in request)

    def exact(self, request: tuple[tuple[int, int], ...]) -> bool:
        """Whether its nominal size itself has a segment that prints as the message's."""
        return any(lo <= self.nbytes <= hi for lo, hi in request)


@dataclass(frozen=True)
class ParameterInventory:
    """A model's parameters as the built model registers them (tied weights once), for aggregate arithmetic."""

    model: str
    names: tuple[str, ...]  # in registration order
    numels: tuple[int, ...]
    one_d: int  # elements of the 1-D parameters (norms, biases): the Trainer's no-weight-decay group
    layers: tuple[tuple[int, int], ...]  # (decoder layer index, its parameters), in order
    vocab_size: int
    hidden_size: int

    @property
    def total(self) -> int:
        return sum(self.numels)

    @property
    def count(self) -> int:
        return len(self.numels)

    @property
    def largest(self) -> int:
        return max(self.numels)

    @property
    def outside_layers(self) -> int:
        """Parameters outside the decoder layers (embedding, final norm, an untied LM head)."""
        return self.total - sum(n for _, n in self.layers)


_LAYER = (re.compile(r"\.layers?\.(\d+)\."), re.compile(r"\.h\.(\d+)\."))


def layer_of(name: str) -> int | None:
    """The decoder layer index a parameter name sits in (``model.layers.3.mlp.up_proj.weight`` → 3)."""
    for pattern in _LAYER:
        m = pattern.search(name)
        if m:
            return int(m.group(1))
    return None


@lru_cache(maxsize=64)
def parameter_inventory(model: str) -> ParameterInventory:
    """The parameters of ``model`` (a shipped name or a config.json path) from the weightless ``_apply`` walk."""
    spec = load_model(model)
    steps = [s for s in unlimited_walk(spec.name, "float16") if s.kind is TensorKind.PARAMETER]
    names = tuple(s.name for s in steps)
    numels = tuple(math.prod(s.shape) for s in steps)
    per_layer: dict[int, int] = {}
    for name, numel in zip(names, numels, strict=True):
        layer = layer_of(name)
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + numel
    one_d = sum(n for s, n in zip(steps, numels, strict=True) if len(s.shape) == 1)
    return ParameterInventory(model=spec.name, names=names, numels=numels, one_d=one_d,
                              layers=tuple(sorted(per_layer.items())), vocab_size=spec.vocab_size,
                              hidden_size=spec.hidden_size)


def count_text(n: int) -> str:
    """A parameter count as people say it: three significant figures (6.74B, 13.0B, 202M, 86.0K)."""
    for scale, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:.{max(0, 2 - int(math.log10(value)))}f}{suffix}"
    return str(n)


def bytes_text(bits: float) -> str:
    """Bytes per element as the arithmetic writes it: 4, 2, 1, 0.5."""
    per = bits / 8
    return f"{per:g} byte" + ("" if per == 1 else "s")
