"""Aggregates over the model's parameters: whole copies per dtype, ZeRO's partitions and FSDP's shards over the world
size, the optimizer states and foreach temporaries of a flat parameter, FSDP's per-unit flat parameters, and a 4-bit
layer's weight dequantized to half.

Where each is allocated is read off the frameworks' sources (paths relative to site-packages):

* ZeRO-1/2 (``deepspeed/runtime/zero/stage_1_and_2.py``): ``__init__`` flattens the half parameters of each group
  into one buffer (``flatten_dense_tensors_aligned``) and clones this rank's 1/W of it to fp32
  (``single_partition_of_fp32_groups``) -- once, in ``deepspeed.initialize``.  ``step`` turns the partition's
  gradients into one fp32 tensor (``single_grad_partition = flat_grad_partition.to(fp32)``) on every step, then the
  optimizer's first step creates its moments (``FusedAdam``: ``state['exp_avg'] = torch.zeros_like(p.data)``, in
  ``deepspeed/ops/adam/fused_adam.py``; torch's AdamW ``_init_group``) -- each the partition's size in fp32.  Stage 2
  keeps the half gradients of the partition in ``grads_in_partition`` (the first reduction in backward), the whole
  parameters that fall in it, so up to two parameters more at the ends.  ZeRO-3 (``stage3.py``) does the same per
  sub-group of ``sub_group_size`` (1e9) elements: ``_prepare_fp32_grad_for_sub_group``.
* The Trainer puts norms and biases in a second parameter group (no weight decay), so DeepSpeed's larger flat
  partition holds N − (norms + biases) elements: the low end of a partition's span.  DeepSpeed pads each parameter
  to 16 bytes and each group to 2·W elements; FSDP pads a flat parameter to a multiple of W: the high end.
* FSDP (``torch/distributed/fsdp``): each wrapped unit (accelerate wraps every decoder layer) is one flat parameter;
  forward and backward all-gather it whole in the compute dtype, backward reduce-scatters its gradient to the 1/W
  shard and upcasts that to fp32; with ``use_orig_params=False`` the optimizer's moments are shard-sized.  FSDP2
  (``fully_shard``) all-gathers each unit (a layer, the embedding, the final norm with the LM head) into one buffer.
* bitsandbytes (``bitsandbytes/functional.py`` ``dequantize_4bit``): ``Linear4bit``'s matmul dequantizes the layer's
  weight into a new half tensor of the full shape, in forward and again in backward.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from oomlab.core.choices import Method, Optimizer, Strategy
from oomlab.core.models import ModelSpec
from oomlab.core.units import format_size
from oomlab.explanation.aggregate import (
    ADAM,
    COPY_DTYPES,
    FSDP,
    FSDP_ON_GPU,
    FULL_TRAINING,
    SOLVED_WORLD_SIZES,
    ZERO_ON_GPU,
    Aggregate,
    AggregateKind,
    ParameterInventory,
    bytes_text,
    count_text,
)
from oomlab.explanation.context import RunContext
from oomlab.explanation.phase import PhaseCode

P = PhaseCode
SETUP: frozenset[PhaseCode] = frozenset()  # deepspeed.initialize, the FSDP or DDP wrapper: no step phase
AT_LOAD = frozenset({P.LOAD, P.MOVE})
IN_STEP = frozenset({P.OPTIMIZER})
ALIGN_ELEMENTS = 8  # NB: DeepSpeed pads each parameter to 16 bytes (8 half elements); FSDP aligns to 16 bytes too
ZERO_12 = frozenset({Strategy.ZERO1, Strategy.ZERO2})
ZERO_SGD = frozenset({*ADAM, Optimizer.SGD})
FSDP1 = frozenset({Strategy.FSDP, Strategy.FSDP_OFFLOAD})
FSDP2 = frozenset({Strategy.FSDP2, Strategy.FSDP2_OFFLOAD})


def world_sizes(ctx: RunContext) -> tuple[tuple[int, str | None], ...]:
    """The divisors to try, each with the assumption it makes: the world size given, else one GPU and the powers of
    two (``SOLVED_WORLD_SIZES``), each marked as solved from the request."""
    if ctx.world_size is not None:
        return ((ctx.world_size, None),)
    return ((1, "the job has one GPU"), *((w, f"the job has {w} GPUs") for w in SOLVED_WORLD_SIZES))


def _bytes(elements: float, bits: float) -> int:
    return math.ceil(elements * bits / 8)


def _over(w: int) -> str:
    return f" / {w} GPUs" if w > 1 else ""


def whole_copies(inv: ParameterInventory) -> Iterator[Aggregate]:
    """Every parameter in one dtype, one flat buffer: fp32, bf16/fp16, int8, 4-bit."""
    n = inv.total
    pad = inv.count * ALIGN_ELEMENTS + 2
    where = {
        "fp32": ("a flattening of every parameter (torch.cat, parameters_to_vector, _flatten_dense_tensors), a flat "
                 "fp32 checkpoint tensor loaded onto the GPU (a ZeRO fp32 partition saved on one GPU)"),
        "bf16/fp16": ("DeepSpeed's flat bit16 group (ZeRO-1/2 deepspeed.initialize: stage_1_and_2.py "
                      "flatten_dense_tensors_aligned), DDP's first gradient bucket of a half model, or a flattening"),
        "int8": "a flat int8 copy (a quantized checkpoint's flat tensor); bitsandbytes quantizes layer by layer",
        "4-bit": "a flat 4-bit copy (a quantized checkpoint's flat tensor); bitsandbytes quantizes layer by layer",
    }
    for name, bits in COPY_DTYPES:
        nominal = _bytes(n, bits)
        yield Aggregate(
            kind=AggregateKind.WHOLE_COPY, what=f"a whole {name} copy of the model",
            arithmetic=f"{count_text(n)} parameters × {bytes_text(bits)} = {format_size(nominal)}",
            nbytes=nominal, span=(nominal, _bytes(n + pad, bits)), where=where[name], phases=AT_LOAD,
            span_note="up to 16 bytes of alignment per parameter (DeepSpeed's flat groups)")


def _partition(inv: ParameterInventory, w: int, solved: str | None, kind: AggregateKind, what: str, bits: float,
               where: str, phases: frozenset[PhaseCode], strategies: frozenset[Strategy] | None, *, factor: int = 1,
               extra: int = 0, whole_only: bool = False, optimizers: frozenset[Optimizer] | None = None,
               note: str | None = None) -> Aggregate:
    """The model's 1/``w`` (``factor`` times) in ``bits`` per element, as ``kind``.

    Its span: from the Trainer's larger parameter group alone (norms and biases left out) -- or the exact 1/w when
    ``whole_only`` (FSDP flattens every parameter) -- to the padding (16 bytes a parameter, 2·W elements a group) and
    ``extra`` elements more.
    """
    n = inv.total
    low = (n if whole_only else n - inv.one_d) / w
    high = n / w + inv.count * ALIGN_ELEMENTS + 2 * w + extra
    nominal = factor * _bytes(n / w, bits)
    arithmetic = (f"{factor} × " if factor > 1 else "") + (
        f"{count_text(n)} parameters × {bytes_text(bits)}{_over(w)} = {format_size(nominal)}")
    if w == 1 and factor == 1:
        what = f"a whole {'fp32' if bits == 32 else 'half' if bits == 16 else 'int8'} copy of the model: {what}"
    return Aggregate(kind=kind, what=what, arithmetic=arithmetic, nbytes=nominal,
                     span=(factor * _bytes(low, bits), factor * _bytes(high, bits)), where=where, phases=phases,
                     strategies=strategies, methods=FULL_TRAINING, optimizers=optimizers, solved=solved,
                     span_note=note or ("FSDP's padding to a multiple of W" if whole_only else
                                        f"the Trainer's second parameter group (norms and biases, "
                                        f"{count_text(inv.one_d)}) left out, up to DeepSpeed's padding"))


def partitions(inv: ParameterInventory, ctx: RunContext) -> Iterator[Aggregate]:
    """The model's flat partition over each world size tried, in each role ZeRO and FSDP give it."""
    for w, solved in world_sizes(ctx):
        on = f" over {w} GPUs" if w > 1 else " on one GPU"
        yield _partition(
            inv, w, solved, AggregateKind.GRADIENT_PARTITION, f"ZeRO's fp32 gradient partition{on}", 32,
            "DeepSpeedZeroOptimizer.step: single_grad_partition = flat_grad_partition.to(fp32), every step "
            "(deepspeed/runtime/zero/stage_1_and_2.py; stage3.py _prepare_fp32_grad_for_sub_group)",
            IN_STEP, ZERO_ON_GPU)
        yield _partition(
            inv, w, solved, AggregateKind.MOMENT, f"one Adam moment (exp_avg or exp_avg_sq) of the flat fp32 "
            f"partition{on}", 32, "the optimizer's first step: state['exp_avg'] = torch.zeros_like(p) over the flat "
            "partition, then kept (deepspeed/ops/adam/fused_adam.py; torch/optim/adamw.py _init_group)",
            IN_STEP, ZERO_ON_GPU | FSDP_ON_GPU, optimizers=ZERO_SGD)
        yield _partition(
            inv, w, solved, AggregateKind.FOREACH_TEMPORARY, f"torch's foreach AdamW temporary of the flat "
            f"partition{on}", 32, "torch.optim.AdamW (foreach, the Trainer's adamw_torch): _foreach_sqrt(exp_avg_sqs) "
            "over the flat partition, every step (torch/optim/adamw.py _multi_tensor_adamw)",
            IN_STEP, ZERO_ON_GPU | FSDP_ON_GPU, optimizers=frozenset({Optimizer.ADAMW, Optimizer.ADAMW_HF}))
        yield _partition(
            inv, w, solved, AggregateKind.STATE_8BIT, f"one 8-bit AdamW moment of the flat partition{on}", 8,
            "bitsandbytes' 8-bit AdamW: state1/state2 = zeros(uint8) of the flat partition at its first step "
            "(bitsandbytes/optim/optimizer.py init_state)",
            IN_STEP, ZERO_ON_GPU | FSDP_ON_GPU, optimizers=frozenset({Optimizer.ADAMW_8BIT}))
        yield _partition(
            inv, w, solved, AggregateKind.MOMENTS, f"both Adam moments of the flat partition{on}, as one tensor", 32,
            "no step allocates both moments at once: a flat optimizer state gathered or loaded as one tensor "
            "(a checkpoint)", AT_LOAD, None, factor=2, optimizers=ADAM)
        if w == 1:
            continue  # one GPU's master weights and shards are the whole fp32 copy, told by whole_copies
        yield _partition(
            inv, w, solved, AggregateKind.GRADIENT_PARTITION, f"ZeRO-2's half gradient partition{on}", 16,
            "ZeRO-2 backward: grads_in_partition = torch.empty(the partition's whole parameters) at the first "
            "reduction; ZeRO-1/2 step: the flat copy of the partition's half gradients (stage_1_and_2.py)",
            frozenset({P.BACKWARD, P.OPTIMIZER}), ZERO_12, extra=2 * inv.largest,
            note="the Trainer's second group left out, up to the two parameters straddling the partition's ends")
        yield _partition(
            inv, w, solved, AggregateKind.MASTER_PARTITION, f"ZeRO's fp32 master partition{on}", 32,
            "deepspeed.initialize: single_partition_of_fp32_groups = this rank's 1/W of the flat half group "
            "cloned to fp32, once (stage_1_and_2.py __init__; stage3.py _create_fp32_partitions)",
            SETUP, ZERO_ON_GPU)
        yield _partition(
            inv, w, solved, AggregateKind.FLAT_SHARD, f"FSDP's flat-parameter shard of the whole model{on}, in fp32",
            32, "FSDP without a wrap policy: the one flat parameter's 1/W shard (the fp32 master at wrapping, the "
            "sharded gradient upcast in backward: torch/distributed/fsdp/_flat_param.py)",
            frozenset({P.BACKWARD}), FSDP_ON_GPU, whole_only=True)
        yield _partition(
            inv, w, solved, AggregateKind.FLAT_SHARD, f"FSDP's flat-parameter shard of the whole model{on}, in half",
            16, "FSDP without a wrap policy, mixed precision: the low-precision shard cast for the all-gather, or the "
            "reduce-scatter's output (torch/distributed/fsdp/_flat_param.py)",
            frozenset({P.FORWARD, P.BACKWARD}), FSDP, whole_only=True)


def _units(inv: ParameterInventory) -> Iterator[tuple[str, int, frozenset[Strategy]]]:
    """FSDP's units: (what, parameters, strategies) -- each decoder layer's size once, then the root's modules."""
    seen: set[int] = set()
    for index, numel in inv.layers:
        if numel not in seen:
            seen.add(numel)
            yield f"decoder layer {index}'s", numel, FSDP
    embed = inv.vocab_size * inv.hidden_size
    rest = inv.outside_layers
    if rest:
        yield "the root unit's (embedding, final norm, LM head)", rest, FSDP1
    if rest > embed:
        yield "the input embedding's", embed, FSDP2
        yield "the final norm and LM head's", rest - embed, FSDP2


def fsdp_units(inv: ParameterInventory, ctx: RunContext) -> Iterator[Aggregate]:
    """Each FSDP unit's flat parameter, unsharded (the all-gather) and, with the world size given, its 1/W shard.

    NB: shards are tried only at the world size given: solved over every power of two, some unit's shard would match
    almost any request of tens of MiB.
    """
    if ctx.strategy is not None and ctx.strategy not in FSDP:
        return
    pad = 64 * ALIGN_ELEMENTS + (ctx.world_size or 1)  # NB: a layer holds at most a few dozen tensors
    for what, numel, strategies in _units(inv):
        for bits, dtype, phases, where in (
            (16, "half", frozenset({P.FORWARD, P.BACKWARD}),
             "FSDP's all-gather of the unit in forward (again in backward), or its unsharded gradient before the "
             "reduce-scatter (torch/distributed/fsdp: _flat_param.py _alloc_padded_unsharded_flat_param; FSDP2 "
             "_fsdp_collectives.py foreach_all_gather)"),
            (32, "fp32", frozenset({P.FORWARD, P.BACKWARD}),
             "the same without mixed precision, or the flat parameter built in fp32 when wrapping"),
        ):
            nominal = _bytes(numel, bits)
            yield Aggregate(
                kind=AggregateKind.UNIT_FLAT, what=f"{what} flat parameter unsharded, in {dtype} (an FSDP unit)",
                arithmetic=f"{count_text(numel)} parameters × {bytes_text(bits)} = {format_size(nominal)}",
                nbytes=nominal, span=(nominal, _bytes(numel + pad, bits)), where=where, phases=phases,
                strategies=strategies, span_note="FSDP's alignment padding")
        w = ctx.world_size
        if w is None or w == 1:
            continue
        for bits, dtype, phases, where in (
            (32, "fp32", frozenset({P.BACKWARD, P.OPTIMIZER}),
             "the unit's sharded fp32 master at wrapping, its sharded gradient upcast after the reduce-scatter, or "
             "(use_orig_params=False) a moment of the shard (torch/distributed/fsdp/_runtime_utils.py)"),
            (16, "half", frozenset({P.FORWARD, P.BACKWARD}),
             "the unit's low-precision shard for the all-gather, or the reduce-scatter's output"),
        ):
            nominal = _bytes(numel / w, bits)
            yield Aggregate(
                kind=AggregateKind.UNIT_SHARD, what=f"{what} flat-parameter shard over {w} GPUs, in {dtype}",
                arithmetic=f"{count_text(numel)} parameters × {bytes_text(bits)} / {w} GPUs = {format_size(nominal)}",
                nbytes=nominal, span=(nominal, _bytes((numel + pad) / w, bits)), where=where, phases=phases,
                strategies=strategies, span_note="FSDP's padding to a multiple of W")


def dequantized(spec: ModelSpec) -> Iterator[Aggregate]:
    """Each distinct nn.Linear weight shape of the decoder layers, dequantized from 4-bit to half."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for layout in spec.layer_layouts:
        for name, proj in layout.projections.items():
            roles = shapes.setdefault((proj.out_features, proj.in_features), [])
            if name not in roles:
                roles.append(name)
    for (out_f, in_f), roles in shapes.items():
        nominal = out_f * in_f * 2
        yield Aggregate(
            kind=AggregateKind.DEQUANTIZED,
            what=f"a 4-bit {'/'.join(roles)} weight dequantized to bf16/fp16",
            arithmetic=f"{out_f} × {in_f} × 2 bytes = {format_size(nominal)}", nbytes=nominal,
            span=(nominal, nominal), where="bitsandbytes' dequantize_4bit in Linear4bit's matmul (a new half tensor "
            "of the weight's shape, in forward and again in backward: bitsandbytes/functional.py)",
            phases=frozenset({P.FORWARD, P.BACKWARD}), methods=frozenset({Method.QLORA}))
