"""One budgeted step as a sequence of allocations and frees: the step's memory over time.

A :class:`~oomlab.budget.result.BudgetResult` holds, for each phase, the allocated bytes by category at that phase's
own peak.  :func:`step_timeline` walks from one to the next as a steady-state step does: the model states held
between steps (what the forward phase holds of weights, master weights, optimizer state and held gradient buffers,
left by the previous step), then forward, backward and the optimizer, each reached by first freeing what the phase
holds less of (the newest tensors first) and then allocating what it holds more of; after the step, back to the
held states.  Freeing before allocating makes each phase's total the running maximum inside it, so the timeline's
peak is the budget's allocated peak, exactly.

Each allocation is a tensor of one category, split over the modules that own it: weights (and full fine-tuning's
gradients and optimizer state) in proportion to the parameters of the embedding, each decoder layer, the final norm
and the LM head (:attr:`ModelSpec.layer_layouts`); LoRA's gradients and optimizer state, and the activations, equally
over the decoder layers; the logits to the LM head; a phase's workspace as one tensor.

NB: the budget knows each phase's peak, not the order of tensors inside it: the sizes and the peak are the budget's,
the order within a phase and the split over modules are this module's choice (a tensor here stands for all of one
module's tensors of a category).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from oomlab.budget.result import ALLOCATED, BudgetResult, MemCategory, Phase
from oomlab.core.choices import Method

__all__ = ["HELD", "StepEvent", "StepTensor", "StepTimeline", "module_shares", "step_timeline"]

# the categories a step holds between steps (what the forward phase holds of them)
HELD = (MemCategory.WEIGHTS, MemCategory.MASTER_WEIGHTS, MemCategory.OPTIMIZER_STATE, MemCategory.GRADIENTS)


@dataclass(frozen=True)
class StepTensor:
    """One allocation of the simulated step."""

    handle: int  # its number, in allocation order
    category: MemCategory
    module: str  # the module that owns it ("model.layers.3", "lm_head", "workspace")
    size_bytes: int
    phase: Phase | None  # the phase that allocated it; None: held between steps


@dataclass(frozen=True)
class StepEvent:
    """An allocation (``alloc`` True) or a free of one tensor, in the phase it happens in (None: between steps)."""

    tensor: StepTensor
    alloc: bool
    phase: Phase | None


@dataclass(frozen=True)
class StepTimeline:
    """The step's events, with the live bytes by category after each."""

    result: BudgetResult
    events: tuple[StepEvent, ...]

    @cached_property
    def live_after(self) -> tuple[Mapping[MemCategory, int], ...]:
        """Live bytes by category after each event (categories with none left out)."""
        live: dict[MemCategory, int] = {}
        out = []
        for e in self.events:
            c = e.tensor.category
            live[c] = live.get(c, 0) + (e.tensor.size_bytes if e.alloc else -e.tensor.size_bytes)
            out.append({k: v for k, v in live.items() if v})
        return tuple(out)

    @property
    def peak_bytes(self) -> int:
        """The largest live total: the budget's :attr:`~BudgetResult.step_allocated_peak_bytes`."""
        return max((sum(s.values()) for s in self.live_after), default=0)

    def phase_spans(self) -> list[tuple[Phase | None, int, int]]:
        """``(phase, first event, last event + 1)`` for each run of events in one phase, in order."""
        spans: list[tuple[Phase | None, int, int]] = []
        for i, e in enumerate(self.events):
            if spans and spans[-1][0] is e.phase:
                spans[-1] = (e.phase, spans[-1][1], i + 1)
            else:
                spans.append((e.phase, i, i + 1))
        return spans


def _parameter_shares(result: BudgetResult) -> list[tuple[str, int]]:
    m = result.setup.model
    shares = [("model.embed_tokens", m.embedding_params)]
    shares += [(f"model.layers.{i}", layout.params) for i, layout in enumerate(m.layer_layouts)]
    shares += [("model.norm", m.final_norm_params), ("lm_head", m.lm_head_params)]
    return shares


def module_shares(result: BudgetResult, category: MemCategory, phase: Phase | None) -> list[tuple[str, int]]:
    """``(module, weight)`` over which a category's bytes are split (see the module docstring)."""
    layers = [(f"model.layers.{i}", 1) for i in range(result.setup.model.num_hidden_layers)]
    if category in (MemCategory.WEIGHTS, MemCategory.MASTER_WEIGHTS):
        return _parameter_shares(result) if result.setup.method is Method.FULL or category is MemCategory.WEIGHTS \
            else layers
    if category in (MemCategory.GRADIENTS, MemCategory.OPTIMIZER_STATE):
        return _parameter_shares(result) if result.setup.method is Method.FULL else layers
    if category is MemCategory.ACTIVATIONS:
        return layers
    if category is MemCategory.LOGITS_LOSS:
        return [("lm_head", 1)]
    return [(f"{phase.value if phase else 'between-step'} workspace", 1)]


def _split(total: int, shares: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """``total`` bytes split in proportion to the shares, exactly (the remainder to the largest share)."""
    weight = sum(w for _, w in shares)
    if weight <= 0:
        return [(shares[0][0] if shares else "workspace", total)]
    parts = [(name, total * w // weight) for name, w in shares]
    rest = total - sum(b for _, b in parts)
    big = max(range(len(parts)), key=lambda i: shares[i][1])
    parts[big] = (parts[big][0], parts[big][1] + rest)
    return [(name, b) for name, b in parts if b > 0]


def step_timeline(result: BudgetResult) -> StepTimeline:
    """The budgeted step as events (see the module docstring); its :attr:`~StepTimeline.peak_bytes` is the budget's
    :attr:`~BudgetResult.step_allocated_peak_bytes` (loading, where it peaks apart, is not a step event)."""
    forward = result.phases.get(Phase.FORWARD, {})
    held = {c: forward.get(c, 0) for c in HELD}
    stages: list[tuple[Phase | None, Mapping[MemCategory, int]]] = [(None, held)]
    stages += [(p, result.phases[p]) for p in Phase if p in result.phases]
    stages.append((None, held))
    live: dict[MemCategory, list[StepTensor]] = {c: [] for c in ALLOCATED}
    events: list[StepEvent] = []
    handles = 0
    for phase, target in stages:
        for c in ALLOCATED:  # frees first: the newest tensors of each category that the phase holds less of
            while live[c] and sum(t.size_bytes for t in live[c]) > target.get(c, 0):
                events.append(StepEvent(live[c].pop(), False, phase))
        for c in ALLOCATED:
            missing = target.get(c, 0) - sum(t.size_bytes for t in live[c])
            if missing <= 0:
                continue
            for module, size in _split(missing, module_shares(result, c, phase)):
                tensor = StepTensor(handles, c, module, size, phase)
                handles += 1
                live[c].append(tensor)
                events.append(StepEvent(tensor, True, phase))
    return StepTimeline(result, tuple(events))
