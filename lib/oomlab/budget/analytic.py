"""The analytic training-memory budget: bytes per GPU, component by component, phase by phase, in microseconds.

:func:`estimate_setup` budgets one validated :class:`~oomlab.core.setup.TrainingSetup` (the public
:func:`oomlab.budget.estimate.estimate` validates names into one first): it takes the setup's inventory
(:mod:`.inventory`: model states from :mod:`.states` through the sharding table of :mod:`.sharding`, activations
from :mod:`.activations`, buffers from :mod:`.workspace`), assembles the phases, and adds what ``memory_allocated``
does not see (allocator overhead, memory outside PyTorch).  Activations are what transformers saves (not
Korthikanti et al. 2022's GPT formula).
"""

from __future__ import annotations

from types import MappingProxyType

from oomlab.budget.inventory import assemble_phases, take_inventory
from oomlab.budget.result import BudgetResult, MemCategory, Source
from oomlab.budget.states import (
    grad_bytes_per_param,
    optimizer_state_bytes_total,
    trainable_parameters,
    weight_bytes_total,
)
from oomlab.core.choices import Strategy
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import MiB
from oomlab.reproduction.outside import seed_outside_bytes

ALLOCATOR_FRAGMENTATION = 0.05  # NB: reserved-but-unallocated share of transient memory (assumption)


def host_ram_bytes(setup: TrainingSetup) -> int:
    """Host memory per node: offloaded states, plus one copy of the weights per process while loading.

    NB: loading assumes each process materialises its replica once on the host (transformers'
    from_pretrained); FSDP/ZeRO-3 loaders that load on rank 0 only need less.
    """
    per_process_load = weight_bytes_total(setup)
    offloaded = 0
    if setup.strategy is Strategy.FSDP_OFFLOAD:
        p = trainable_parameters(setup)
        offloaded = (weight_bytes_total(setup) + grad_bytes_per_param(setup) * p
                     + optimizer_state_bytes_total(setup)) // setup.nodes
    return setup.gpus * per_process_load + offloaded


def estimate_setup(setup: TrainingSetup, outside_bytes: int | None = None) -> BudgetResult:
    """The analytic budget of one validated setup."""
    inventory = take_inventory(setup)
    phases = assemble_phases(setup, inventory)
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    at_peak = {k: v for k, v in phases[peak_phase].items() if v}
    transient = sum(at_peak.values()) - inventory.states.persistent
    outside = seed_outside_bytes() if outside_bytes is None else outside_bytes
    components = dict(at_peak)
    components[MemCategory.ALLOCATOR_OVERHEAD] = round(ALLOCATOR_FRAGMENTATION * transient) + 2 * MiB
    components[MemCategory.OUTSIDE_PYTORCH] = outside
    notes = (
        "steady-state step: optimizer state exists from the previous step; gradients set to None after it",
        f"outside PyTorch: {outside} bytes (CUDA context; default derived from the seed's T4 message)",
        f"allocator overhead: {ALLOCATOR_FRAGMENTATION:.0%} of transient bytes + 2 MiB (assumption)",
    )
    return BudgetResult(
        setup=setup, source=Source.ANALYTIC, peak_phase=peak_phase,
        phases=MappingProxyType({p: MappingProxyType(c) for p, c in phases.items()}),
        components=MappingProxyType(components), host_ram_bytes=host_ram_bytes(setup),
        capacity_bytes=setup.gpu.total_memory_bytes, notes=notes,
    )
