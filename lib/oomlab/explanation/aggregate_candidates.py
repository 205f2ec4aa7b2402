"""Which aggregates of the model the message's request can be -- whole copies, partitions and shards, optimizer
states, flat buffers and buckets, logits, dequantized weights -- best supported first.

A catalogue entry is a candidate when its span meets the request range (:meth:`Aggregate.matches`, the tolerance
policy of :mod:`.aggregate`).  The ranking weighs, like :func:`oomlab.explanation.candidates.tensor_candidates`, the
evidence for each:

* its nominal size exact (+4) or only within its span (+2);
* the traceback's phase: one it is allocated in (+4) or not (−4; dropped when the match also rests on an assumption
  solved from the request, since then nothing but arithmetic supports it);
* what the caller told: a strategy that allocates it (+4) or not (−8); a method or optimizer that does (+2) or not
  (−8);
* an innermost frame showing its allocation site (+8: ``single_grad_partition``, ``exp_avg``, ``_rebuild_buckets`` …);
* an assumption solved from the request (a world size, a batch × seq) (−2).

Ties keep the order of kinds -- in a step, the allocation made every step before the one made on the first step only
(ZeRO's fp32 gradient partition before an Adam moment of it) -- then the catalogue's order (the logits before their
shifted copy, which only older code makes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomlab.core.models import load_model
from oomlab.core.size_ranges import format_interval
from oomlab.core.units import format_size
from oomlab.explanation.aggregate import Aggregate, AggregateKind, parameter_inventory
from oomlab.explanation.buckets import ddp_buckets, reduce_buckets
from oomlab.explanation.context import RunContext
from oomlab.explanation.frames import Frame
from oomlab.explanation.logits import logits
from oomlab.explanation.model_copies import dequantized, fsdp_units, partitions, whole_copies
from oomlab.explanation.phase import PhaseCode, TracebackPhase

INNERMOST_FRAMES = 4  # the allocation site is among the last frames before the error

# What an innermost frame shows when it allocates each kind: matched against "file function code".
FRAME_HINTS: dict[AggregateKind, re.Pattern[str]] = {
    AggregateKind.WHOLE_COPY: re.compile(r"_flatten_dense_tensors|parameters_to_vector|torch\.cat\(|flatten_dense_"
                                         r"tensors_aligned|serialization\.py \w*load"),
    AggregateKind.GRADIENT_PARTITION: re.compile(r"single_grad_partition|flat_grad_partition|grads_in_partition|"
                                                 r"_prepare_fp32_grad_for_sub_group"),
    AggregateKind.MOMENT: re.compile(r"exp_avg(?!_sq_sqrt)|momentum_buffer|_init_group"),
    AggregateKind.FOREACH_TEMPORARY: re.compile(r"_foreach_sqrt|exp_avg_sq_sqrt"),
    AggregateKind.STATE_8BIT: re.compile(r"bitsandbytes/optim|init_state|state1|state2"),
    AggregateKind.MASTER_PARTITION: re.compile(r"single_partition_of_fp32_groups|weights_partition|"
                                               r"_create_fp32_partitions"),
    AggregateKind.FLAT_SHARD: re.compile(r"fsdp/.*(?:_get_shard|_init_flat_param|_mp_shard|sharded_grad)"),
    AggregateKind.UNIT_FLAT: re.compile(r"_alloc_padded_unsharded|_all_gather|foreach_all_gather|_unshard"),
    AggregateKind.UNIT_SHARD: re.compile(r"fsdp/.*(?:reduce_scatter|_mp_shard|sharded_grad|_get_shard)"),
    AggregateKind.DDP_BUCKET: re.compile(r"_rebuild_buckets|_ddp_init_helper|Reducer\("),
    AggregateKind.REDUCE_BUCKET: re.compile(r"setup_buckets|reduce_bucket_size|ipg_bucket"),
    AggregateKind.LOGITS: re.compile(r"lm_head\("),
    AggregateKind.LOGITS_FP32: re.compile(r"\.float\(\)|cross_entropy|log_softmax|loss_utils\.py"),
    AggregateKind.DEQUANTIZED: re.compile(r"dequantize_4bit|dequantize|matmul_4bit|MatMul4Bit"),
}

_PHASE_WORDS = {PhaseCode.MOVE: "moving the model", PhaseCode.LOAD: "loading", PhaseCode.FORWARD: "the forward pass",
                PhaseCode.BACKWARD: "the backward pass", PhaseCode.OPTIMIZER: "the optimizer step"}
_KIND_ORDER = {kind: i for i, kind in enumerate(AggregateKind)}


@dataclass(frozen=True)
class AggregateCandidate:
    """An aggregate whose request sizes include the message's "Tried to allocate", with why it ranks where it does."""

    rank: int  # 1 = best supported
    aggregate: Aggregate
    exact: bool  # its nominal size's segment prints as the message's request
    in_phase: bool | None  # allocated in the phase the traceback shows (None: the traceback shows none)
    evidence: tuple[str, ...]


def catalogue(model: str, ctx: RunContext, request: tuple[tuple[int, int], ...]) -> list[Aggregate]:
    """Every aggregate of ``model`` in the context told (the logits' token counts solved against ``request``)."""
    spec = load_model(model)
    inv = parameter_inventory(spec.name)
    return [*whole_copies(inv), *partitions(inv, ctx), *fsdp_units(inv, ctx), *ddp_buckets(inv),
            *reduce_buckets(inv), *logits(spec, ctx, request), *dequantized(spec)]


def allocated_when(phases: frozenset[PhaseCode]) -> str:
    """When an aggregate is allocated, in words: ``allocated in the optimizer step``."""
    if not phases:
        return "allocated at setup (deepspeed.initialize, the DDP or FSDP wrapper), in no step phase"
    return "allocated in " + " or ".join(_PHASE_WORDS[p] for p in PhaseCode if p in phases)


def _frame_hint(kind: AggregateKind, frames: tuple[Frame, ...]) -> str | None:
    pattern = FRAME_HINTS.get(kind)
    for f in frames[-INNERMOST_FRAMES:] if pattern else ():
        text = f"{f.file.replace(chr(92), '/')} {f.function} {f.code}"
        if pattern.search(text):
            return f"{f.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{f.line} in {f.function}" + (
                f": {f.code[:80]}" if f.code else "")
    return None


def _score(agg: Aggregate, request: tuple[tuple[int, int], ...], ctx: RunContext, phase: TracebackPhase | None,
           frames: tuple[Frame, ...]) -> tuple[int, bool, list[str]] | None:
    """The aggregate's score, exactness and evidence; None when it is dropped."""
    exact = agg.exact(request)
    score = 4 if exact else 2
    evidence = [f"{agg.arithmetic}: " + ("its segment prints as the request" if exact else
                f"within its span {format_interval(agg.span)} ({agg.span_note}), though not at its nominal size")]
    if phase is not None:
        if phase.code in agg.phases:
            score += 4
            evidence.append(f"allocated in {_PHASE_WORDS[phase.code]}, the phase the traceback shows")
        elif agg.solved:
            return None
        else:
            score -= 4
            evidence.append(f"the traceback shows {_PHASE_WORDS[phase.code]}, but it is {allocated_when(agg.phases)}")
    for told, allowed, label, bonus in ((ctx.strategy, agg.strategies, "strategy", 4),
                                        (ctx.method, agg.methods, "method", 2),
                                        (ctx.optimizer, agg.optimizers, "optimizer", 2)):
        if told is None or allowed is None:
            continue
        if told in allowed:
            score += bonus
            evidence.append(f"allocated under the {label} given ({told.value})")
        else:
            score -= 8
            evidence.append(f"not allocated under the {label} given ({told.value}; only under "
                            f"{', '.join(sorted(a.value for a in allowed))})")
    hint = _frame_hint(agg.kind, frames)
    if hint:
        score += 8
        evidence.append(f"the traceback shows its allocation: {hint}")
    if agg.solved:
        score -= 2
        evidence.append(f"assumes {agg.solved}: not given, solved from the request")
    evidence.append(f"where: {agg.where}")
    return score, exact, evidence


def aggregate_candidates(
    request: tuple[tuple[int, int], ...], model: str, ctx: RunContext, phase: TracebackPhase | None,
    frames: tuple[Frame, ...] = (),
) -> tuple[AggregateCandidate, ...]:
    """The aggregates of ``model`` whose request sizes meet ``request``, best supported first."""
    if not request:
        return ()
    scored = []
    for index, agg in enumerate(catalogue(model, ctx, request)):
        if not agg.matches(request):
            continue
        result = _score(agg, request, ctx, phase, frames)
        if result is not None:
            in_phase = None if phase is None else phase.code in agg.phases
            scored.append((-result[0], _KIND_ORDER[agg.kind], index, agg, result[1], in_phase, tuple(result[2])))
    scored.sort(key=lambda s: s[:3])
    return tuple(AggregateCandidate(rank=i + 1, aggregate=agg, exact=exact, in_phase=in_phase, evidence=evidence)
                 for i, (*_, agg, exact, in_phase, evidence) in enumerate(scored))


def render_aggregate(c: AggregateCandidate) -> str:
    """One candidate in a sentence: the arithmetic, then what it is."""
    a = c.aggregate
    text = f"{a.arithmetic}: {a.what}"
    if a.solved:
        text += f", if {a.solved}"
    if not c.exact:
        text += f" (within its span {format_size(a.span[0])} – {format_size(a.span[1])})"
    return text
