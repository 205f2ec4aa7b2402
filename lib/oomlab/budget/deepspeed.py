"""DeepSpeed ZeRO-1/2/3 per GPU and per phase, as ``deepspeed.initialize`` (DeepSpeed 0.19.8) runs a step.

Every term cites the DeepSpeed line it follows (paths relative to ``site-packages/deepspeed``); the layout of the
partitions is :mod:`.deepspeed_layout`, the knobs :mod:`.deepspeed_config`.  What the engine does to the model:

* every parameter is cast to the half dtype in place, buffers are not (``runtime/engine.py:1851-1875``, from
  ``_configure_distributed_model`` :2074-2088); ``torch_autocast`` is off (``runtime/constants.py:189``): the module
  runs in half precision with no autocast -- :func:`oomlab.budget.activations.regime` is HALF (LoRA: POLICY, the
  adapters are cast too) -- and the rotary ``inv_freq`` buffers stay fp32;
* ZeRO-1/2 and a ZeRO-3 model not built under ``zero.Init`` are moved whole to the GPU (``engine.py:2093-2094``);
  a ZeRO-3 model built by ``from_pretrained`` under an HF DeepSpeed config is partitioned at construction
  (``transformers/modeling_utils.py:3812-3833`` ``zero.Init``; ``partition_parameters.py:1232-1258``): no full
  replica is ever moved to a GPU, so the seed's load-time OOM cannot happen (:func:`load_peak_bytes`);
* the optimizer (:func:`optimizer_source`): the JSON's ``"type": "AdamW"`` block builds FusedAdam
  (``engine.py:2402-2408``), DeepSpeedCPUAdam when offloaded (``engine.py:2384-2400``); both keep
  ``exp_avg``/``exp_avg_sq`` like the fp32 partition (``ops/adam/fused_adam.py:155-157``) and update in place: no
  step temporary.  Without a block the HF Trainer builds its own (``transformers/integrations/deepspeed.py:586-589``;
  ``optim`` defaults to ``adamw_torch_fused`` on torch >= 2.8, ``adamw_torch`` before, ``training_args.py:806-811``)
  and DeepSpeed wraps it, stepping the fp32 partition with it (``stage_1_and_2.py:3139``, ``stage3.py:2921``):
  ``AdamW(fused=True)``, ``sgd`` and ``adamw-8bit`` update in place, but ``adamw_torch`` is foreach on CUDA and
  allocates ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``, one fp32 partition (ZeRO-3: one sub-group)
  beside the fp32 gradient (``torch/optim/adam.py:762``, torch 2.13) -- :func:`adam_temp_bytes`;
* ZeRO-1/2 is ``DeepSpeedZeroOptimizer(partition_grads = stage == 2)`` (``engine.py:2696``), ZeRO-3
  ``DeepSpeedZeroOptimizer_Stage3``; bf16 + ZeRO-1 + ``grad_accum_dtype: fp32`` is ``BF16_Optimizer``
  (``engine.py:2305-2310``, ``runtime/bf16_optimizer.py``).

The phases are the steady state (a complete ZeRO-3 trace, the optimizer state already there).
"""

from __future__ import annotations

from oomlab.budget import deepspeed_layout as layout
from oomlab.budget.deepspeed_config import DeepSpeedSettings, OptimizerSource, settings_for
from oomlab.budget.result import MemCategory, Phase
from oomlab.budget.sharding import SHARES, Share
from oomlab.budget.states import NF4_DQ_BITS, lora_parameters, nf4_state_fixed_bytes, quantized_parameters
from oomlab.budget.step_parts import Inventory, ZeroStates
from oomlab.core.choices import Method, Optimizer, Precision
from oomlab.core.errors import InvalidValueError
from oomlab.core.memo import BoundedMemo
from oomlab.core.setup import TrainingSetup

W, G, M, S = MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.MASTER_WEIGHTS, MemCategory.OPTIMIZER_STATE
A, LG, X = MemCategory.ACTIVATIONS, MemCategory.LOGITS_LOSS, MemCategory.WORKSPACE
FP32 = 4
ADAM8_BLOCK = 256  # bitsandbytes: one fp32 absmax per 256 values (the flat partition is one tensor)


def model_dtype_bytes(setup: TrainingSetup) -> int:
    """The dtype every parameter is cast to: half with fp16/bf16 enabled, else fp32 (``engine.py:1799-1810``)."""
    return FP32 if setup.precision is Precision.FP32 else 2


def buffer_bytes(setup: TrainingSetup) -> int:
    """The rotary ``inv_freq`` and ``original_inv_freq`` buffers, fp32 (not cast: ``engine.py:1866-1875``)."""
    return 2 * FP32 * (setup.model.head_dim // 2)


def frozen_bytes(setup: TrainingSetup) -> int:
    """LoRA/QLoRA's frozen base as stored on one full replica (QLoRA: NF4 with double quantization, its codes)."""
    if setup.method is Method.FULL:
        return 0
    n = setup.model.num_parameters
    if setup.method is Method.QLORA:
        quantized = quantized_parameters(setup)
        return round(quantized * NF4_DQ_BITS / 8) + 2 * (n - quantized) + nf4_state_fixed_bytes(setup)
    return model_dtype_bytes(setup) * n


def state_bytes(setup: TrainingSetup, partition: int) -> int:
    """Optimizer state of one rank's fp32 partition (Adam: two fp32 moments, ``fused_adam.py:155-157``)."""
    if setup.optimizer.adam:
        return 2 * FP32 * partition
    if setup.optimizer is Optimizer.SGD:
        return FP32 * partition  # momentum_buffer
    return round(2 * partition * (1 + 4 / ADAM8_BLOCK))  # AdamW8bit: two uint8 states + block absmax


def optimizer_source(setup: TrainingSetup, ds: DeepSpeedSettings) -> OptimizerSource:
    """Whose optimizer steps the partition: as the JSON says, or (no JSON) as oomlab's launch JSON writes it
    (:func:`~oomlab.budget.deepspeed_config.resolve`)."""
    return ds.optimizer_source or settings_for(setup, ds).optimizer_source


def foreach_adamw(setup: TrainingSetup, ds: DeepSpeedSettings) -> bool:
    """Does torch's foreach AdamW step the fp32 partition on the GPU?  ``adamw`` from the Trainer
    (``optim="adamw_torch"``: no ``foreach`` passed, torch picks foreach for CUDA tensors,
    ``torch/optim/optimizer.py:161-186``; ``adamw_hf`` makes the same temporary, ``denom = exp_avg_sq.sqrt()``)
    or from a block with ``torch_adam: true``; not offloaded (accelerate swaps a client optimizer for
    DeepSpeedCPUAdam, ``accelerate/accelerator.py:2374-2383``; the step runs on the host)."""
    return (setup.optimizer in (Optimizer.ADAMW, Optimizer.ADAMW_HF)
            and optimizer_source(setup, ds) is not OptimizerSource.DEEPSPEED
            and not setup.strategy.offloads_optimizer)


def adam_temp_bytes(setup: TrainingSetup, ds: DeepSpeedSettings, elements: int) -> int:
    """The optimizer's own temporary stepping ``elements`` fp32 values: foreach AdamW's ``exp_avg_sq_sqrt``
    (``torch/optim/adam.py:762``); nothing for FusedAdam, ``AdamW(fused=True)``, SGD or 8-bit AdamW.
    The Trainer's two parameter groups (decay, and no decay: norms and biases) step one after the other: ``elements``
    is the larger group's partition."""
    return FP32 * elements if foreach_adamw(setup, ds) else 0


def _step_temps(setup: TrainingSetup, ds: DeepSpeedSettings, grad: int, elements: int) -> int:
    """``step()`` over ``elements`` of one partition: the gradients flattened in their dtype and converted to fp32
    beside them (``.to`` of an fp32 gradient is the same tensor), then the fp32 gradient alive while the optimizer
    steps with its own temporary (ZeRO-1/2: ``stage_1_and_2.py:3113-3139``; ZeRO-3: ``stage3.py:2683-2693``, 2921)."""
    convert = (grad + (FP32 if grad != FP32 else 0)) * elements
    return max(convert, FP32 * elements + adam_temp_bytes(setup, ds, elements))


def zero_shares(setup: TrainingSetup, ds: DeepSpeedSettings) -> dict[MemCategory, Share]:
    """Which model states this GPU holds whole, as its partition or not at all: the strategy's row of
    :data:`oomlab.budget.sharding.SHARES`, and the one knob that moves a category -- ``zero3-offload`` with
    ``offload_param`` off (:class:`~oomlab.budget.deepspeed_config.DeepSpeedSettings`) keeps its half partitions on
    the GPU.  BF16_Optimizer (bf16 + ZeRO-1 + fp32 gradient accumulation) is another optimizer, not a cell: its
    whole fp32 gradient buffer is :func:`zero_states`'.
    """
    shares = dict(SHARES[setup.strategy])
    if shares[W] is Share.HOST and not ds.offload_param:
        shares[W] = Share.SHARDED
    return shares


def _held(how: Share, whole: int, sharded: int) -> int:
    """One category's bytes on this GPU: ``whole`` (a replica), ``sharded`` (this rank's partition, DeepSpeed's
    alignment and padding included) or nothing (on the host)."""
    return whole if how is Share.WHOLE else sharded if how is Share.SHARDED else 0


def partition_12(setup: TrainingSetup, ds: DeepSpeedSettings) -> layout.FlatPartition:
    """ZeRO-1/2's flat partition: one group per parameter group of the optimizer DeepSpeed wraps (the Trainer's two,
    ``stage_1_and_2.py:428-434``), else one."""
    return layout.flat_partition(setup, optimizer_source(setup, ds) is OptimizerSource.TRAINER)


def _zero12(setup: TrainingSetup, ds: DeepSpeedSettings) -> ZeroStates:
    lp, part = model_dtype_bytes(setup), partition_12(setup, ds)
    ps, shares = part.partition, zero_shares(setup, ds)
    offload = shares[S] is Share.HOST  # offload_optimizer: the fp32 master, gradients and the step on the host
    last = layout.trainable_numels(setup)[-1]  # backward's first gradient
    trained = sum(layout.trainable_numels(setup))
    bf16_optimizer = ds.grad_accum_fp32 and setup.strategy.zero_stage == 1
    if bf16_optimizer and (not setup.precision.uses_bf16 or offload):
        raise InvalidValueError("grad_accum_dtype fp32 with ZeRO-1 is budgeted for bf16 (BF16_Optimizer) only")
    # bit16_groups_flat (:505-534)
    weights = _held(shares[W], lp * part.aligned, lp * ps) + frozen_bytes(setup) + buffer_bytes(setup)
    bucket = lp * ds.reduce_bucket_size * (2 if ds.overlap_comm else 1)  # setup_buckets (:3256-3280)
    full = 0
    if bf16_optimizer:
        # the fp32 accumulation buffer of the whole model, not partitioned (bf16_optimizer.py:191), and the bf16
        # gradients beside it until step() clears them (clear_lp_grads, :405-406; measured)
        held = FP32 * part.aligned
        grads = held + lp * trained
    else:
        # grads_in_partition, whole params of the partition (:2186-2197); fp32 accumulation: compact fp32 (:1259);
        # offloaded (HOST), the in-partition slices go to the host's fp32 partition (:1819-1900): none on the GPU
        held = 0
        grads = _held(shares[G], lp * trained, FP32 * ps if ds.grad_accum_fp32 else lp * part.in_partition)
        if setup.strategy.zero_stage == 1 and not ds.overlap_comm:
            # the phase rule SHARES' cell leaves out: ZeRO-1 reduces only in the epilogue (:2290-2295,
            # reduce_gradients :958-981), so autograd's backward leaves every half gradient alive first
            full = lp * trained
    return ZeroStates(
        # single_partition_of_fp32_groups (:560-561) and its optimizer state
        weights=weights, master=_held(shares[M], FP32 * part.aligned, FP32 * ps),
        optimizer=_held(shares[S], state_bytes(setup, part.aligned), state_bytes(setup, ps)),
        gradients=grads, held_gradients=held, full_gradients=full,
        bucket=bucket if ds.contiguous_gradients and not bf16_optimizer else 0, bucket_permanent=False,
        # allreduce_bucket's flatten of the bucket's slices (:2367): at most what the bucket holds
        flush=0 if bf16_optimizer else lp * min(ds.reduce_bucket_size, trained),
        # step(): flatten(averaged_gradients) in half, then .to(fp32) (:3113-3118), the optimizer's own temporary
        # (BF16_Optimizer steps over its held fp32 gradients, bf16_optimizer.py:422)
        step_temps=0 if offload else adam_temp_bytes(setup, ds, part.group_partition) if bf16_optimizer
        else _step_temps(setup, ds, lp, part.group_partition),
        offload_temps=lp * part.largest if offload else 0, gathered_forward=0, gathered_layer=0,
        persistent_gathered=0, last_grad=0,
        # a gradient larger than the bucket is reduced on its own (:1443-1449); a smaller one is copied into the
        # bucket; offload converts its in-partition slice to fp32 on the GPU (:1900)
        first_grad=(lp * last if last > ds.reduce_bucket_size else bucket) + (FP32 * last if offload else 0),
        # the fp32 master (:565) and gradient partition (:934-941), the optimizer state, the half staging copy
        # (:567-575) and temp_grad_buffer_for_cpu_offload (:653-657)
        host=(FP32 + FP32 + lp) * ps + state_bytes(setup, ps) + lp * part.largest if offload else 0,
    )


def _zero3(setup: TrainingSetup, ds: DeepSpeedSettings) -> ZeroStates:
    lp, threshold = model_dtype_bytes(setup), ds.stage3_param_persistence_threshold
    part = layout.stage3_partition(setup, ds.sub_group_size, threshold)
    shares = zero_shares(setup, ds)
    offload, grad = shares[S] is Share.HOST, FP32 if ds.grad_accum_fp32 else lp
    many = setup.world_size > 1
    persistent = lp * part.persistent if many else 0  # gathered after the first step (stage3.py:2841)
    window, ahead = layout.gathered_at_forward_end(setup, ds.stage3_max_reuse_distance, threshold,
                                                   ds.stage3_prefetch_bucket_size, ds.stage3_max_live_parameters)
    prefetch = layout.prefetch_elements(setup, ds.stage3_prefetch_bucket_size, ds.stage3_max_live_parameters,
                                        threshold)
    largest = layout.largest_module(setup) if many else 0
    trained_sizes = layout.trainable_numels(setup)
    trained = sum(trained_sizes)

    def in_flight(n: int) -> int:  # a gradient larger than the bucket is reduce-scattered on its own (:1621-1646)
        return lp * n if n > ds.reduce_bucket_size else 0

    # ds_tensor / lp_param_buffer (stage3.py:972); offload_param: on the host (:975-1000)
    partitions = _held(shares[W], lp * sum(layout.all_numels(setup)), lp * part.all_params)
    # grad_partitions_flat_buffer, permanent, in the accumulation dtype (stage3.py:786-801)
    gradients = _held(shares[G], grad * trained, grad * part.trained)
    return ZeroStates(
        weights=partitions + persistent + buffer_bytes(setup),
        master=_held(shares[M], FP32 * trained, FP32 * part.trained),
        optimizer=_held(shares[S], state_bytes(setup, trained), state_bytes(setup, part.trained)),
        gradients=gradients, held_gradients=gradients,
        full_gradients=0, bucket=lp * ds.reduce_bucket_size if ds.contiguous_gradients else 0, bucket_permanent=True,
        # reduce_scatter_coalesced's cat of the bucket's gradients (runtime/comm/coalesced_collectives.py:102-121)
        flush=lp * min(ds.reduce_bucket_size, trained),
        # _prepare_fp32_grad_for_sub_group: flatten (grad dtype) and .to(fp32) of one sub-group (stage3.py:2683-2700)
        step_temps=0 if offload else _step_temps(setup, ds, grad, part.sub_group), offload_temps=0,
        gathered_forward=lp * (window + ahead), gathered_layer=lp * (largest + prefetch) if many else 0,
        persistent_gathered=persistent, first_grad=in_flight(trained_sizes[-1]), last_grad=in_flight(trained_sizes[0]),
        # the gradient partitions (stage3.py:786-795), the fp32 partitions, the optimizer state, one fp32 gradient
        # buffer per sub-group (:1336-1342), and with offload_param the half partitions (:975-1000)
        host=(grad + FP32 + FP32) * part.trained + state_bytes(setup, part.trained)
        + (lp * part.all_params if shares[W] is Share.HOST else 0) if offload else 0,
    )


_ZERO: BoundedMemo[tuple, ZeroStates] = BoundedMemo()


def zero_states(setup: TrainingSetup, settings: DeepSpeedSettings | None = None) -> ZeroStates:
    """The setup's :class:`ZeroStates` (memoised on what they depend on)."""
    key = (setup.model, setup.strategy, setup.method, setup.precision, setup.optimizer, setup.world_size,
           setup.lora_rank, setup.lora_targets, setup.checkpointing, settings)
    found = _ZERO.get(key)
    if found is None:
        ds = settings_for(setup, settings)
        found = _ZERO[key] = _zero3(setup, ds) if setup.strategy.zero_stage == 3 else _zero12(setup, ds)
    return found


def deepspeed_phases(setup: TrainingSetup, inventory: Inventory) -> dict[Phase, dict[MemCategory, int]]:
    """Allocated bytes by category in each phase of a DeepSpeed step, from the inventory's :class:`ZeroStates` and
    step tensors (activations in DeepSpeed's regime)."""
    z, t = inventory.zero, inventory.tensors
    held = {W: z.weights, M: z.master, S: z.optimizer, G: z.held_gradients}
    permanent = z.offload_temps + (z.bucket if z.bucket_permanent else 0)
    bucket = z.bucket  # ZeRO-1/2: from the first gradient that enters it to the end of the epilogue (:924-932, :1061)
    acts, loss, logits_grad = t.layer_activations, t.loss_backward, t.logits
    if setup.strategy.zero_stage == 3:
        gathered = permanent + z.gathered_forward
        forward = {**held, A: acts, LG: t.logits_forward, X: gathered}
        backward = [
            {**held, A: acts, LG: loss, X: gathered},  # start: the loss's gradients, the gathered window
            {**held, A: acts, LG: logits_grad, X: gathered + z.first_grad},  # the LM head's gradient
            # end: the embedding gathered for its backward, its gradient in flight, a bucket being reduced
            {**held, X: permanent + z.gathered_layer + z.last_grad + z.flush},
        ]
        if setup.checkpointing:
            backward.append({**held, A: t.recompute_activations,
                             X: permanent + t.recompute_workspace + z.gathered_layer + z.flush})
        # step(): _partition_all_parameters releases every gathered parameter (stage3.py:2878)
        optimizer = {**held, W: z.weights - z.persistent_gathered, X: permanent + z.step_temps}
    else:
        forward = {**held, A: acts, LG: t.logits_forward, X: permanent}
        # the first gradient: ZeRO-2 on the last rank allocates its partition buffer there (:2186-2197)
        first = z.held_gradients if z.full_gradients or z.held_gradients else z.gradients
        backward = [
            {**held, A: acts, LG: loss, X: permanent},
            {**held, A: acts, LG: logits_grad, G: first, X: permanent + z.first_grad},
        ]
        if z.full_gradients:  # ZeRO-1 / BF16_Optimizer: every half gradient, then the partition buffer beside them
            backward.append({**held, G: z.full_gradients + z.gradients, X: permanent + bucket})
        else:
            # ZeRO-2: the partition buffer and a bucket being flushed; offload converts one gradient slice to fp32 on
            # the GPU on its way to the host (stage_1_and_2.py:1900)
            converted = 2 * z.offload_temps if model_dtype_bytes(setup) == 2 else 0
            backward.append({**held, G: z.gradients, X: permanent + bucket + z.flush + converted})
        if setup.checkpointing:
            grads = 0 if z.full_gradients else z.gradients
            backward.append({**held, A: t.recompute_activations, G: max(grads, z.held_gradients),
                             X: permanent + t.recompute_workspace + bucket})
        optimizer = {**held, G: z.gradients, X: permanent + z.step_temps}
    pick = lambda cands: max(cands, key=lambda d: sum(d.values()))  # noqa: E731
    return {Phase.FORWARD: forward, Phase.BACKWARD: pick(backward), Phase.OPTIMIZER: optimizer}


# ------------------------------------------------------------------------------------------- host and loading


def host_offload_bytes(setup: TrainingSetup, settings: DeepSpeedSettings | None = None) -> int:
    """Host bytes of one rank's offloaded states (pinned on CUDA; ``accelerator/cpu_accelerator.py:283-293``).

    zero2-offload: fp32 master (``stage_1_and_2.py:565``), fp32 gradient partition (:934-941), optimizer state
    (DeepSpeedCPUAdam, fp32 moments: ``ops/adam/cpu_adam.py``), the half staging copy (:567-575) and
    ``temp_grad_buffer_for_cpu_offload`` (:653-657).  zero3-offload: the gradient partitions (``stage3.py:786-795``),
    fp32 partitions, optimizer state, one fp32 gradient buffer per sub-group (:1336-1342), and with ``offload_param``
    the half partitions (:975-1000).
    """
    return zero_states(setup, settings).host if setup.strategy.deepspeed else 0


def load_peak_bytes(setup: TrainingSetup, z: ZeroStates) -> int:
    """The most one GPU holds while ``deepspeed.initialize`` builds the engine (before the first step).

    ZeRO-1/2: the half replica moved whole (``engine.py:2094``), then flattened -- on the GPU (params + flat copy)
    when it has room for the copy, else on the host (``stage_1_and_2.py:449-463``): the replica itself is the floor.
    ZeRO-3 under ``zero.Init``: each module is partitioned right after it is built
    (``partition_parameters.py:1232-1258``) and initialised or loaded with its parameters gathered one module at a time:
    the partitions plus the largest module (``transformers/integrations/deepspeed.py:298-335``), never a replica.
    """
    lp = model_dtype_bytes(setup)
    if setup.strategy.zero_stage == 3:
        return z.weights - z.persistent_gathered + lp * layout.largest_module(setup)
    replica = lp * sum(layout.all_numels(setup)) + buffer_bytes(setup)
    return replica


_BUILT_BY = {
    OptimizerSource.DEEPSPEED: "the DeepSpeed JSON's optimizer block",
    OptimizerSource.TORCH_ADAM: "the DeepSpeed JSON's optimizer block with torch_adam (engine.py:2377-2380)",
    OptimizerSource.TRAINER: "the HF Trainer (no optimizer block: create_optimizer, transformers "
                             "integrations/deepspeed.py:586-589)",
    OptimizerSource.SCRIPT: "the training script (oomlab's train.py: one parameter group)",
}


def optimizer_note(setup: TrainingSetup, settings: DeepSpeedSettings | None = None) -> str:
    """Which optimizer steps the fp32 partition, who built it, and its temporary in the step, in a sentence."""
    ds = settings_for(setup, settings)
    source = optimizer_source(setup, ds)
    offload = setup.strategy.offloads_optimizer
    if setup.optimizer is Optimizer.ADAMW and source is OptimizerSource.DEEPSPEED:
        kind = "DeepSpeedCPUAdam on the host" if offload else "FusedAdam"
        return f"optimizer: {kind}, built by {_BUILT_BY[source]}; in place, no temporary"
    if offload:
        return (f"optimizer: {setup.optimizer.value} from {_BUILT_BY[source]}; offloaded, it steps on the host "
                "(accelerate swaps a torch optimizer for DeepSpeedCPUAdam unless zero_force_ds_cpu_optimizer is "
                "false, accelerator.py:2374-2383): no temporary on the GPU")
    what = {Optimizer.ADAMW: "torch.optim.AdamW (foreach on CUDA: adamw_torch)",
            Optimizer.ADAMW_FUSED: "torch.optim.AdamW(fused=True) (adamw_torch_fused)",
            Optimizer.ADAMW_HF: "transformers' AdamW (adamw_hf; the flat partition is one tensor to its loop)",
            Optimizer.ADAMW_8BIT: "bitsandbytes AdamW8bit", Optimizer.SGD: "torch.optim.SGD"}[setup.optimizer]
    if foreach_adamw(setup, ds):
        if setup.strategy.zero_stage == 3:
            part = layout.stage3_partition(setup, ds.sub_group_size, ds.stage3_param_persistence_threshold).sub_group
            where = "one optimizer sub-group"
        else:
            part, where = partition_12(setup, ds).group_partition, "this rank's partition"
        temp = adam_temp_bytes(setup, ds, part)
        return (f"optimizer: {what}, built by {_BUILT_BY[source]} and wrapped by DeepSpeed; its step allocates "
                f"exp_avg_sq_sqrt, one fp32 copy of {where} ({temp / 2**30:.2f} GiB; torch/optim/adam.py:762), "
                "beside the fp32 gradient -- adamw-fused (--optim adamw_torch_fused) has none")
    return f"optimizer: {what}, built by {_BUILT_BY[source]} and wrapped by DeepSpeed; in place, no temporary"


def deepspeed_notes(setup: TrainingSetup, inventory: Inventory) -> tuple[str, ...]:
    """What the budget of a DeepSpeed setup assumes, in sentences."""
    ds, z = settings_for(setup, inventory.deepspeed), inventory.zero
    stage = setup.strategy.zero_stage
    knobs = (f"reduce_bucket_size {ds.reduce_bucket_size:,} elements, overlap_comm {str(ds.overlap_comm).lower()}, "
             f"contiguous_gradients {str(ds.contiguous_gradients).lower()}")
    if stage == 3:
        knobs += (f", stage3_prefetch_bucket_size {ds.stage3_prefetch_bucket_size:,}, "
                  f"stage3_param_persistence_threshold {ds.stage3_param_persistence_threshold:,}, "
                  f"stage3_max_live_parameters {ds.stage3_max_live_parameters:,}, stage3_max_reuse_distance "
                  f"{ds.stage3_max_reuse_distance:,}, sub_group_size {ds.sub_group_size:,}")
        load = (f"loading: from_pretrained under zero.Init partitions every module as it is built; at most "
                f"{load_peak_bytes(setup, z) / 2**30:.2f} GiB per GPU, no full replica moved to a GPU")
    else:
        load = (f"loading: deepspeed.initialize moves the whole half replica to each GPU "
                f"({load_peak_bytes(setup, z) / 2**30:.2f} GiB; engine.py:2094) before partitioning")
    lora = ""
    if setup.method is not Method.FULL:
        lora = f"; peft's {lora_parameters(setup):,} adapter parameters cast to half by the engine"
    return (f"DeepSpeed ZeRO-{stage}: {knobs}{lora}", load, optimizer_note(setup, inventory.deepspeed))
