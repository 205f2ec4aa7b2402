"""How DeepSpeed 0.19.8 lays a model's parameters out per rank: the ZeRO-1/2 flat group and its partitions, the ZeRO-3
per-parameter partitions and optimizer sub-groups, and which ZeRO-3 parameters stay gathered.

Everything is computed from the parameter list the model registers (the spec's layer layouts: the embedding, per
layer its projections, other tensors and norms, the final norm, the LM head; peft's ``lora_A``/``lora_B`` per targeted
projection), in element counts.  Citations are to ``site-packages/deepspeed``.
The per-GPU figure is the largest over the ranks (the rank that runs out first).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from oomlab.core.choices import Method
from oomlab.core.models import ModelSpec
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import ceil_div

NCCL_START_ALIGNMENT = 2  # stage_1_and_2.py:387 nccl_start_alignment_factor (4-byte alignment / sizeof(fp16))


@dataclass(frozen=True)
class Module:
    """One module with parameters of its own, as ZeRO-3's parameter coordinator fetches it."""

    name: str
    numels: tuple[int, ...]  # its direct parameters' element counts
    layer: int | None = None  # decoder layer index (None outside the layers)


def _layer_parts(spec: ModelSpec, index: int) -> tuple[list[tuple[str, int, int, int]], list[int], list[int]]:
    """One decoder layer: its nn.Linear modules as ``(name, in, out, bias)``, its norm tensors, its other tensors
    (an MoE router and the experts' fused 3-D tensors), from the spec's layer layout."""
    layouts = getattr(spec, "layer_layouts", None)
    h = spec.hidden_size
    if layouts is None:  # a spec without per-layer layouts: LLaMA's layer
        linears = [(name, n_in, n_out, 0) for name, (n_in, n_out) in spec.projection_shapes.items()]
        return linears, [h, h], []
    layer = layouts[index]
    linears = [(name, p.in_features, p.out_features, p.out_features if p.bias else 0) for name, p in layer.linears]
    # NB: norms as h-sized tensors (the remainder, e.g. q/k norms, as one): what the persistence threshold sees
    norms = [h] * (layer.norm_params // h) + ([layer.norm_params % h] if layer.norm_params % h else [])
    other = [layer.router_params] if layer.router_params else []
    if layer.expert_params:  # gate_up_proj (E x 2i x h) and down_proj (E x h x i)
        other += [layer.expert_params * 2 // 3, layer.expert_params - layer.expert_params * 2 // 3]
    return linears, norms, other


@lru_cache(maxsize=256)
def modules(spec: ModelSpec, method: Method, rank: int, targets: tuple[str, ...]) -> tuple[Module, ...]:
    """The model's modules with parameters, in registration order (``model.parameters()`` order): the embedding,
    each layer's projections (a LoRA-targeted one is three modules: peft's ``base_layer``, ``lora_A``, ``lora_B``),
    its other tensors and norms, the final norm, the LM head."""
    h = spec.hidden_size
    out = [Module("embed_tokens", (spec.embedding_params,))]
    lora = set(targets) if method is not Method.FULL else set()
    for layer in range(spec.num_hidden_layers):
        linears, norms, other = _layer_parts(spec, layer)
        for name, n_in, n_out, bias in linears:
            out.append(Module(name, (n_in * n_out, bias) if bias else (n_in * n_out,), layer))
            if name.rsplit(".", 1)[-1] in lora:
                out += [Module(f"{name}.lora_A", (rank * n_in,), layer),
                        Module(f"{name}.lora_B", (n_out * rank,), layer)]
        out += [Module(f"tensor{k}", (n,), layer) for k, n in enumerate(other)]
        out += [Module(f"{k}.layernorm", (n,), layer) for k, n in enumerate(norms)]
    final_norm = getattr(spec, "final_norm_params", h)
    out.append(Module("norm", (h, final_norm - h) if final_norm > h else (final_norm,)))
    if spec.lm_head_params:
        out.append(Module("lm_head", (spec.lm_head_params,)))
    return tuple(out)


def model_modules(setup: TrainingSetup) -> tuple[Module, ...]:
    return modules(setup.model, setup.method, setup.lora_rank, setup.lora_targets)


def trained(setup: TrainingSetup, module: Module) -> bool:
    """Full fine-tuning trains every parameter; LoRA only the adapters."""
    return _trained(setup.method, module)


def _trained(method: Method, module: Module) -> bool:
    return method is Method.FULL or ".lora_" in module.name


def trainable_numels(setup: TrainingSetup) -> tuple[int, ...]:
    """The optimizer's parameters in group order: what ZeRO flattens and partitions (stage_1_and_2.py:428-434)."""
    return _numels(setup.model, setup.method, setup.lora_rank, setup.lora_targets)[0]


def all_numels(setup: TrainingSetup) -> tuple[int, ...]:
    return _numels(setup.model, setup.method, setup.lora_rank, setup.lora_targets)[1]


@lru_cache(maxsize=256)
def _numels(spec: ModelSpec, method: Method, rank: int, targets: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """(trainable, all, (largest module,)) element counts, once per model and adapter (the plan asks per setup)."""
    mods = modules(spec, method, rank, targets)
    trainable = tuple(n for m in mods if _trained(method, m) for n in m.numels)
    return trainable, tuple(n for m in mods for n in m.numels), (max(sum(m.numels) for m in mods),)


# ---------------------------------------------------------------------------------------------- ZeRO-1 and 2


@dataclass(frozen=True)
class FlatPartition:
    """ZeRO-1/2's flat groups of the trained parameters (one per optimizer parameter group) and one rank's partition
    of them (elements, summed over the groups)."""

    aligned: int  # the flat half buffers, each padded to a multiple of 2N (stage_1_and_2.py:441-447)
    partition: int  # ps: aligned / N (get_data_parallel_partitions, :2559-2577; partition_size :586)
    in_partition: int  # Sp: whole parameters overlapping the partitions, largest over ranks (get_partition_info)
    largest: int  # the largest trained parameter (offload's temp_grad_buffer_* , :653-661)
    group_partition: int  # the largest group's partition: step() converts and steps one group at a time (:3075-3141)


def _held_per_rank(numels: tuple[int, ...], world: int) -> tuple[int, int, tuple[int, ...]]:
    """(aligned, partition, per rank the whole parameters overlapping its partition) of one flat group."""
    alignment = NCCL_START_ALIGNMENT * world
    aligned = ceil_div(sum(numels), alignment) * alignment
    size = aligned // world
    held = []
    for rank in range(world):  # get_partition_info (stage_1_and_2.py:2579-2611), no parameter padding by default
        start, end, index, total = size * rank, size * (rank + 1), 0, 0
        for n in numels:
            if start <= index < end or index < start < index + n:
                total += n
            index += n
        held.append(total)
    return aligned, size, tuple(held)


@lru_cache(maxsize=1024)
def _flat(groups: tuple[tuple[int, ...], ...], world: int) -> FlatPartition:
    parts = [_held_per_rank(g, world) for g in groups if g]
    worst = max(sum(p[2][rank] for p in parts) for rank in range(world))
    return FlatPartition(sum(p[0] for p in parts), sum(p[1] for p in parts), worst,
                         max((n for g in groups for n in g), default=0), max(p[1] for p in parts))


@lru_cache(maxsize=256)
def _decay_groups(spec: ModelSpec, method: Method, rank: int, targets: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """The HF Trainer's two groups of the trained parameters: weight decay, and none for norms and biases
    (``get_decay_parameter_names``, transformers trainer.py:1408-1418; groups :1273-1286), in registration order."""
    decay, no_decay = [], []
    for module in modules(spec, method, rank, targets):
        if not _trained(method, module):
            continue
        norm = module.name.endswith("layernorm") or module.name == "norm"
        for k, n in enumerate(module.numels):  # a Linear's second tensor is its bias
            (no_decay if norm or k else decay).append(n)
    return tuple(decay), tuple(no_decay)


def flat_partition(setup: TrainingSetup, trainer_groups: bool = False) -> FlatPartition:
    """ZeRO-1/2's partition: one group of every trained parameter, or (``trainer_groups``) the HF Trainer's two."""
    if trainer_groups:
        groups = _decay_groups(setup.model, setup.method, setup.lora_rank, setup.lora_targets)
    else:
        groups = (trainable_numels(setup),)
    return _flat(groups, setup.world_size)


# -------------------------------------------------------------------------------------------------------- ZeRO-3


@dataclass(frozen=True)
class Stage3Partition:
    """ZeRO-3's per-parameter partitions on one rank (elements)."""

    trained: int  # S_t: sum of ceil(n / N) over trained params (partition_parameters.py:1690-1699, 1816-1817)
    all_params: int  # the same over every parameter (frozen ones are partitioned too)
    sub_group: int  # the largest optimizer sub-group of the trained partitions (stage3.py:1210-1233)
    persistent: int  # parameters of <= stage3_param_persistence_threshold elements (parameter_offload.py:317-335)


@lru_cache(maxsize=1024)
def _stage3(trained_numels: tuple[int, ...], numels: tuple[int, ...], world: int, sub_group_size: int,
            threshold: int) -> Stage3Partition:
    parts = [ceil_div(n, world) for n in trained_numels]
    total = sum(parts)
    if sub_group_size >= total:  # _create_fp16_sub_groups: one group
        largest = total
    else:
        largest = current = 0
        for n in parts:  # a group closes once it reaches sub_group_size
            current += n
            if current >= sub_group_size:
                largest, current = max(largest, current), 0
        largest = max(largest, current)
    persistent = sum(n for n in numels if n <= threshold)  # model_persistence_threshold: sys.maxsize (config.py:235)
    return Stage3Partition(total, sum(ceil_div(n, world) for n in numels), largest, persistent)


def stage3_partition(setup: TrainingSetup, sub_group_size: int, threshold: int) -> Stage3Partition:
    return _stage3(trainable_numels(setup), all_numels(setup), setup.world_size, sub_group_size, threshold)


def _forward_order(mods: tuple[Module, ...], layers: int) -> list[Module]:
    """Modules in the order a forward runs them.  NB: each layer's norms first, then its modules as registered
    (LLaMA runs its post-attention norm between attention and MLP: the reuse distances differ by one norm)."""
    order = [m for m in mods if m.layer is None and m.name == "embed_tokens"]
    for layer in range(layers):
        own = [m for m in mods if m.layer == layer]
        order += [m for m in own if m.name.endswith("layernorm")] + [m for m in own if not m.name.endswith("layernorm")]
    return order + [m for m in mods if m.layer is None and m.name != "embed_tokens"]


def _trace(mods: tuple[Module, ...], layers: int, checkpointing: bool) -> tuple[list[Module], int]:
    """The coordinator's trace of one step (forward, then backward with each checkpointed layer's forward run again
    inside its backward), and where backward starts in it.  NB: backward visits a layer's modules in reverse."""
    forward = _forward_order(mods, layers)
    backward = list(reversed([m for m in forward if m.layer is None and m.name != "embed_tokens"]))
    for layer in reversed(range(layers)):
        own = [m for m in forward if m.layer == layer]
        backward += (own if checkpointing else []) + list(reversed(own))
    backward += [m for m in forward if m.name == "embed_tokens"]
    return forward + backward, len(forward)


@lru_cache(maxsize=256)
def _window(mods: tuple[Module, ...], layers: int, checkpointing: bool, max_reuse: int, threshold: int,
            bucket: int, max_live: int) -> tuple[int, int]:
    trace, backward_start = _trace(mods, layers, checkpointing)
    size = {id(m): sum(n for n in m.numels if n > threshold) for m in trace}
    kept: set[int] = set()
    for position, module in enumerate(trace[:backward_start]):
        if not size[id(module)]:
            continue
        traversed = 0
        for later in trace[position + 1:]:
            if traversed >= max_reuse:
                break
            if later is module:
                kept.add(id(module))
                break
            traversed += sum(later.numels)
    window = sum(size[k] for k in kept)
    # after the LM head's forward the prefetcher walks the backward trace, skipping what is still gathered, until
    # min(max_live - gathered, bucket) elements are in flight
    limit, prefetched, seen = min(max(max_live - window, 0), bucket), 0, set(kept)
    for module in trace[backward_start:]:
        if prefetched >= limit:
            break
        if size[id(module)] and id(module) not in seen:
            seen.add(id(module))
            prefetched += size[id(module)]
    return window, prefetched


def gathered_at_forward_end(setup: TrainingSetup, max_reuse_distance: int, threshold: int, bucket: int,
                            max_live: int) -> tuple[int, int]:
    """(reuse window, prefetch) elements of the non-persistent parameters gathered at the end of forward.

    From the second step (a complete trace), a module's parameters are not released after its forward if they are
    used again before ``max_reuse_distance`` elements of the trace have gone by (``__params_to_release``,
    partitioned_param_coordinator.py:634-665, counting every parameter met on the way): with the default 1e9 the
    modules nearest the LM head stay gathered from their forward to their backward.  The prefetch
    (``_fetch_sub_module_impl``, :450-485) then gathers the next parameters backward needs beyond them.
    """
    if setup.world_size == 1:  # one rank: param.data is a view of its partition, nothing is gathered
        return 0, 0
    return _window(model_modules(setup), setup.model.num_hidden_layers, setup.checkpointing, max_reuse_distance,
                   threshold, max(bucket, 0), max_live)


@lru_cache(maxsize=256)
def _prefetch(mods: tuple[Module, ...], layers: int, limit: int, threshold: int) -> int:
    sizes = [sum(n for n in m.numels if n > threshold) for m in _forward_order(mods, layers)]
    sizes = [n for n in sizes if n]
    worst = 0
    for start in range(len(sizes)):
        total = 0
        for n in sizes[start:]:
            if total >= limit:
                break
            total += n
        worst = max(worst, total)
    return worst


def prefetch_elements(setup: TrainingSetup, bucket: int, max_live: int, threshold: int) -> int:
    """Elements prefetched ahead of the running module: whole parameters until ``min(max_live, bucket)`` elements are
    in flight (``_fetch_sub_module_impl``, partitioned_param_coordinator.py:450-485), the most over the forward.
    NB: an upper bound (the prefetcher skips parameters already gathered, and ``max_live`` counts them)."""
    if setup.world_size == 1 or bucket <= 0:
        return 0
    return _prefetch(model_modules(setup), setup.model.num_hidden_layers, min(max_live, bucket), threshold)


def largest_module(setup: TrainingSetup) -> int:
    """Elements of the largest module's own parameters (DeepSpeed's estimator calls it the largest layer:
    ``model_to_params``, stage3.py:4055-4065)."""
    return _numels(setup.model, setup.method, setup.lora_rank, setup.lora_targets)[2][0]
