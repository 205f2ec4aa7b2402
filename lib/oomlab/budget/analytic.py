"""The analytic training-memory budget: bytes per GPU, component by component, phase by phase, in microseconds.

:func:`sft_estimate` budgets one validated :class:`~oomlab.core.setup.TrainingSetup` (the public
:func:`oomlab.budget.api.estimate` validates names into one first): it takes the setup's inventory
(:mod:`.inventory`: model states from :mod:`.states` through the sharding table of :mod:`.sharding`, activations
from :mod:`.activations`, buffers from :mod:`.workspace`), assembles the phases, and adds what ``memory_allocated``
does not see (allocator overhead, memory outside PyTorch).  Activations are what transformers saves (not
Korthikanti et al. 2022's GPT formula).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from oomlab.budget import states
from oomlab.budget.activation_offload import offload_note
from oomlab.budget.deepspeed import deepspeed_notes
from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.inventory import assemble_phases, take_inventory
from oomlab.budget.loss_kernels import loss_note
from oomlab.budget.nf4_init import torchao_init
from oomlab.budget.optimizer_in_backward import NOTE as IN_BACKWARD_NOTE
from oomlab.budget.result import BudgetResult, MemCategory, Source, outside_note
from oomlab.budget.step_parts import Inventory
from oomlab.core.choices import FSDP1_STRATEGIES, Method, Optimizer, Precision
from oomlab.core.memo import BoundedMemo
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import MiB
from oomlab.core.versions import FACTS, Fact, applies
from oomlab.reproduction.outside import case_outside

ALLOCATOR_FRAGMENTATION = 0.05  # NB: reserved-but-unallocated share of transient memory (assumption)
ALLOCATOR_NOTE = f"allocator overhead: {ALLOCATOR_FRAGMENTATION:.0%} of transient bytes + 2 MiB (assumption)"


def loads_once_per_node(setup: TrainingSetup) -> bool:
    """Does one process per node load the weights, the others building the model empty (on ``meta``)?

    FSDP as oomlab launches it sets accelerate's ``fsdp_cpu_ram_efficient_loading`` (and the ``sync_module_states``
    it needs): accelerate exports ``FSDP_CPU_RAM_EFFICIENT_LOADING``, transformers' ``is_fsdp_enabled()`` then holds,
    and ``from_pretrained`` on every rank but local rank 0 leaves the weights unmaterialised
    (``_move_missing_keys_from_meta_to_device`` returns early, ``not is_local_dist_rank_0()``); FSDP1 broadcasts rank
    0's units (``sync_module_states``), FSDP2 moves the model to ``meta`` and scatters rank 0's state dict
    (``fsdp2_load_full_state_dict``).  Both skip quantized models (``not is_quantized`` in transformers,
    ``not model_has_params4bit`` in accelerate): QLoRA loads on every rank.
    """
    return setup.strategy.fsdp and setup.method is not Method.QLORA


def host_ram_bytes(setup: TrainingSetup, inventory: Inventory) -> int:
    """Host memory per node: offloaded states, plus the copies of the weights made while loading.

    NB: loading assumes each process materialises its replica once on the host (transformers' from_pretrained);
    FSDP with ``fsdp_cpu_ram_efficient_loading`` (oomlab's FSDP launch files set it) loads once per node
    (:func:`loads_once_per_node`).  DeepSpeed ZeRO-3 loads under ``zero.Init``: each module is partitioned onto the
    GPU as it is built and the checkpoint is read tensor by tensor (memory-mapped safetensors; NB: page cache not
    counted), so no process holds a replica.  The offloaded states are the inventory's (DeepSpeed's:
    :func:`oomlab.budget.deepspeed.host_offload_bytes` per rank).
    """
    states = inventory.states
    if setup.strategy.deepspeed:
        loading_processes = 0 if setup.strategy.zero_stage == 3 else setup.gpus
    else:
        loading_processes = 1 if loads_once_per_node(setup) else setup.gpus
    # activation offloading: each process's saved activations in pinned host memory
    return loading_processes * states.replica + states.host_per_node + setup.gpus * inventory.tensors.host_activations


_OUTSIDE: BoundedMemo[tuple, Any] = BoundedMemo()


def _outside(setup: TrainingSetup) -> Any:
    key = (setup.model.name, setup.gpu, setup.world_size)
    if key not in _OUTSIDE:
        _OUTSIDE[key] = case_outside(setup.model.name, setup.gpu, setup.world_size)
    return _OUTSIDE[key]


_OPTIMIZER_NOTES = {
    Optimizer.ADAMW: "adamw: torch.optim.AdamW as constructed by hand (foreach on CUDA): one state-sized "
                     "temporary (the sqrt of exp_avg_sq) in the step",
    Optimizer.ADAMW_FUSED: "adamw-fused: AdamW(fused=True), the HF Trainer's default (adamw_torch_fused): no "
                           "temporary in the step",
    Optimizer.ADAMW_HF: "adamw-hf: transformers' own AdamW (optim='adamw_hf'), a loop over the parameters: one "
                        "temporary the size of the largest trained tensor's state (the sqrt of its exp_avg_sq)",
    Optimizer.ADAMW_8BIT: "adamw-8bit: bitsandbytes AdamW8bit, two 1-byte moments plus block scales, updated in place",
    Optimizer.SGD: "sgd: SGD with momentum, updated in place",
}


def launch_note(setup: TrainingSetup) -> str:
    """What the setup's precision and optimizer mean for its launch (the budget's notes say it)."""
    half = "bf16" if setup.precision.uses_bf16 else "fp16"
    if setup.precision is Precision.FP32:
        precision = "fp32: weights, gradients, optimizer state and compute in float32"
    elif setup.precision not in (Precision.FP16_MIXED, Precision.BF16_MIXED):
        precision = f"{setup.precision.value}: weights, gradients and optimizer state in {half}, no master weights"
    elif setup.strategy in FSDP1_STRATEGIES:
        precision = (f"{setup.precision.value} under accelerate's FSDP1: MixedPrecision(param, reduce, buffer = "
                     f"{half}); trained flat parameters upcast to fp32 and sharded, gathered in {half}; accelerate's "
                     "autocast finds nothing to cast; outputs converted to fp32")
    elif setup.strategy.fsdp:
        precision = (f"{setup.precision.value} under accelerate's FSDP2: MixedPrecisionPolicy(param, reduce, output = "
                     f"{half}); trained parameters upcast to fp32 and sharded, gathered in {half}; no autocast")
    elif setup.strategy.deepspeed:
        # the optimizer -- the JSON's, the Trainer's or the script's, and its temporary -- is the DeepSpeed note's
        # (budget.deepspeed.optimizer_note, from the settings this note is not keyed by)
        return (f"{setup.precision.value} under DeepSpeed: every parameter cast to {half} in place (adapters too), no "
                "autocast, an fp32 master partition; the optimizer: see the DeepSpeed notes")
    elif setup.method is Method.FULL:
        precision = (f"{setup.precision.value} under accelerate (or the HF Trainer): torch.autocast({half}) around the "
                     "forward over fp32 weights, their half copies cached until the forward ends; outputs converted "
                     "to fp32")
    else:  # autocast caches only the casts of leaves that need a gradient: the adapters
        precision = (f"{setup.precision.value} under accelerate (or the HF Trainer): torch.autocast({half}) around the "
                     "forward, the adapters' half copies cached until the forward ends; outputs converted to fp32")
    if states.kbit_upcast(setup):
        precision += (f"; the frozen base in 4 bits (computed in {half}), its other parameters upcast to fp32 by "
                      "peft's prepare_model_for_kbit_training, peft's adapters in fp32")
    elif states.fp32_loaded_base(setup):
        precision += ("; the frozen base kept in fp32 as from_pretrained loaded it (base dtype float32), autocast's "
                      f"{half} copies of its weights made per op and kept for backward, peft's adapters in fp32")
    elif setup.method is not Method.FULL and setup.precision is not Precision.FP32:
        # torchtune's LoRA modules built under its dtype, as frameworks.torchtune_states budgets them on one device
        own = setup.versions.framework == "torchtune" and not (setup.strategy.fsdp or setup.strategy.deepspeed)
        precision += (f"; the frozen base stored in {half}, " + (f"torchtune's adapters in {half}" if own else
                                                                   "peft's adapters in fp32"))
    optimizer = _OPTIMIZER_NOTES[setup.optimizer]
    if setup.versions.framework != "transformers":  # the Trainer's default is no default of torchtune's or litgpt's
        optimizer = optimizer.replace(", the HF Trainer's default (adamw_torch_fused)", "")
    return precision + "; " + optimizer


_VERSIONS_NOTES: BoundedMemo[tuple, tuple[str, ...]] = BoundedMemo()
# the facts that move a QLoRA budget only (said for QLoRA setups only)
QLORA_FACTS = (Fact.BNB_DROPS_SAVED_INPUT, Fact.TORCHAO_CHUNKED_NF4, Fact.TORCHTUNE_FROZEN_NF4)


def versions_notes(setup: TrainingSetup) -> tuple[str, ...]:
    """The releases the budget assumes (given or installed) and what they change here (:mod:`oomlab.core.versions`),
    memoised on what they depend on."""
    key = (setup.versions, setup.method, setup.precision, states.kbit_upcast(setup), states.has_experts(setup))
    if key not in _VERSIONS_NOTES:
        _VERSIONS_NOTES[key] = _versions_notes(setup)
    return _VERSIONS_NOTES[key]


def _versions_notes(setup: TrainingSetup) -> tuple[str, ...]:
    v = setup.versions
    notes = [f"versions: {v.describe()}"]
    # the Trainer's default optimizer is a launch fact (the launch reader's), not one of this budget's terms
    # the launch's facts (the Trainer's default optimizer and attention) are the launch reader's, not this budget's
    launch = (Fact.PEFT_KBIT_UPCAST, Fact.TRAINER_FUSED_ADAMW, Fact.TRAINER_ADAMW_TORCH, Fact.SDPA_DEFAULT)
    older = [f for f in FACTS if not applies(f, v) and f not in launch
             and (f not in QLORA_FACTS or setup.method is Method.QLORA)
             and (f is not Fact.MOE_EXPERTS_3D or (setup.method is Method.QLORA and states.has_experts(setup)))]
    notes += [f"before {f.release_text}: {f.text.split('; before, ')[-1]}" for f in older]
    if states.kbit_upcast(setup):
        notes.append("qlora as peft prepares it (prepare_model_for_kbit_training, as oomlab's train.py and TRL call "
                     "it): the embedding, norms and LM head upcast to fp32, so the residual stream, the SwiGLU's "
                     "saved tensors and each layer's checkpointed input are fp32 and the head's half autocast copy is "
                     "kept for backward")
    elif setup.method is Method.QLORA and setup.versions.framework == "transformers":
        notes.append("qlora without peft's fp32 upcast of the embedding, norms and head (" + (
            "peft before 0.4.0" if not applies(Fact.PEFT_KBIT_UPCAST, v) else
            "sharded or pure-half launches: TRL skips it, DeepSpeed casts back to half") + ")")
    if setup.method is Method.QLORA and states.has_experts(setup) and not states.experts_quantized(setup):
        dtype = "float32 (peft's upcast casts them too)" if states.kbit_upcast(setup) else setup.precision.compute_dtype
        notes.append(f"MoE experts in {dtype}, not 4-bit: transformers >= 5 stores them as 3-D parameters "
                     "bitsandbytes does not quantize (transformers 4.x quantized them as nn.Linear: --versions "
                     "transformers==4.x)")
    return tuple(notes)


_LAUNCH_NOTES: BoundedMemo[tuple, str] = BoundedMemo()


def sft_estimate(setup: TrainingSetup, outside_bytes: int | None = None,
                 deepspeed: DeepSpeedSettings | None = None) -> BudgetResult:
    """The analytic budget of one validated setup (``deepspeed``: DeepSpeed's knobs, for its strategies)."""
    inventory = take_inventory(setup, deepspeed)
    phases = assemble_phases(setup, inventory)
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    at_peak = {k: v for k, v in phases[peak_phase].items() if v}
    transient = sum(at_peak.values()) - inventory.states.persistent
    if outside_bytes is None:
        shipped = _outside(setup)
        outside, outside_source = shipped.total_bytes, shipped.source
    else:
        outside, outside_source = outside_bytes, None
    components = dict(at_peak)
    components[MemCategory.ALLOCATOR_OVERHEAD] = round(ALLOCATOR_FRAGMENTATION * transient) + 2 * MiB
    components[MemCategory.OUTSIDE_PYTORCH] = outside
    key = (setup.strategy, setup.precision, setup.method, setup.optimizer, states.kbit_upcast(setup),
           states.fp32_loaded_base(setup), setup.versions.framework)  # every input of launch_note
    if key not in _LAUNCH_NOTES:
        _LAUNCH_NOTES[key] = launch_note(setup)
    notes = (
        _LAUNCH_NOTES[key],
        "steady-state step: optimizer state exists from the previous step; gradients set to None after it",
        outside_note(outside, outside_source),
        ALLOCATOR_NOTE,
    )
    notes += versions_notes(setup)
    if setup.loss.fused:
        notes += (loss_note(setup),)
    if setup.offload_activations:
        notes += (offload_note(inventory.tensors),)
    if setup.optimizer_in_backward:
        notes += (IN_BACKWARD_NOTE,)
    if setup.strategy.deepspeed:
        notes += deepspeed_notes(setup, inventory)
    load = torchao_init(setup, outside)  # torchtune < 0.2.0's QLoRA init (torchao 0.1), else None
    if load is not None:
        notes += (load.what,)
    if len(setup.model.attention_implementations()) == 1:  # make_setup took the one transformers allows
        notes += (f"attention: {setup.attention.value}, the only implementation transformers runs for "
                  f"{setup.model.family.value} models (whatever was asked)",)
    return BudgetResult(
        setup=setup, source=Source.ANALYTIC, peak_phase=peak_phase,
        phases=MappingProxyType({p: MappingProxyType(c) for p, c in phases.items()}),
        components=MappingProxyType(components), host_ram_bytes=host_ram_bytes(setup, inventory),
        capacity_bytes=setup.gpu.total_memory_bytes, notes=notes, outside_source=outside_source, load=load,
    )
