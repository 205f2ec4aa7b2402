"""``oomlab check --message``: the user's OOM message set against the budget of the launch as read.

The message says where the run died (the phase, from its traceback's frames) and how much PyTorch held then
(``already allocated`` + ``Tried to allocate``: what that moment needed).  The budget of the setup as read predicts
the allocated peak of each phase.  Where the message needed more than the phase's predicted peak with the margin of
the setup class, the run that died was not the setup as read -- a setting differed -- and the message says so; where
a setting the files leave open (the sequence length, the micro-batch: assumed, not read) would explain the figure,
the smallest value that does is inferred, as the seed's reproduction infers its unknowns.  Loads no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import BudgetResult, MemCategory, Phase
from oomlab.core.errors import OomlabError
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import format_size
from oomlab.explanation.explain import Explanation, explain
from oomlab.explanation.phase import PhaseCode
from oomlab.launch.origin import OriginKind
from oomlab.launch.read import UserLaunch
from oomlab.remedies.margin import margin_for

_STEP = {PhaseCode.FORWARD: Phase.FORWARD, PhaseCode.BACKWARD: Phase.BACKWARD, PhaseCode.OPTIMIZER: Phase.OPTIMIZER}
_OPEN = ("seq", "batch")  # the settings a message can pin down when the files leave them open
_ORDER = (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)


def _phase_bytes(result: BudgetResult, phase: Phase | None) -> tuple[Phase, int]:
    """The allocated peak the budget predicts in ``phase`` (None: the step's peak phase)."""
    phase = phase or result.peak_phase
    return phase, sum(result.phases[phase].values())


@dataclass(frozen=True)
class MessageReading:
    """The message beside the budget of the launch as read."""

    phase: Phase | None  # the step's phase the traceback shows (None: no traceback, or not in a step)
    phase_text: str  # the message's phase in words ("no traceback" when none)
    needed_bytes: int | None  # already allocated + tried to allocate (None: the message prints no allocated figure)
    predicted_phase: Phase
    predicted_bytes: int  # the budget's allocated peak in that phase
    margin_bytes: int
    differs: bool  # the message needed more than the prediction with the margin: the run was not the setup as read
    inferred: tuple[tuple[str, int], ...]  # open settings (assumed, not read) whose smallest value explains it
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return {"phase": None if self.phase is None else self.phase.value, "phase_text": self.phase_text,
                "needed_bytes": self.needed_bytes, "predicted_phase": self.predicted_phase.value,
                "predicted_bytes": self.predicted_bytes, "margin_bytes": self.margin_bytes, "differs": self.differs,
                "inferred": {k: v for k, v in self.inferred}, "sentence": self.sentence}


def _infer(setup: TrainingSetup, launch: UserLaunch, phase: Phase | None, needed: int) -> tuple[tuple[str, int], ...]:
    """The smallest value of each open setting (its origin an assumption) at which the budget's phase reaches
    ``needed``, doubling from the assumed value; none where no value up to the model's limits does."""
    found = []
    for name in _OPEN:
        field = launch.fields.get(name)
        if field is None or field.origin.kind is not OriginKind.ASSUMED:
            continue
        limit = setup.model.max_position_embeddings if name == "seq" else 4096
        value = getattr(setup, name)
        while value < limit:
            value = min(value * 2, limit)
            try:
                _, predicted = _phase_bytes(estimate_setup(setup.with_(**{name: value})), phase)
            except OomlabError:
                break
            if predicted >= needed:
                found.append((name, value))
                break
    return tuple(found)


def read_message(launch: UserLaunch, text: str | bytes) -> tuple[MessageReading, Explanation]:
    """The message ``text`` against the budget of ``launch`` (its explanation too, for the JSON)."""
    s = launch.setup
    exp = explain(text, model=s.model.name, gpu=s.gpu.name, gpus=s.gpus, nodes=s.nodes, strategy=s.strategy,
                  method=s.method, optimizer=s.optimizer, batch=s.batch, seq=s.seq)
    m = exp.message
    step_phase = _STEP.get(exp.phase.code) if exp.phase is not None else None
    phase_text = "no traceback" if exp.phase is None else exp.phase.text
    result = estimate_setup(s, deepspeed=launch.deepspeed if s.strategy.deepspeed else None)
    predicted_phase, predicted = _phase_bytes(result, step_phase)
    margin = margin_for(s).bytes_for(predicted)
    needed = None
    if m.allocated is not None:
        needed = m.allocated.value_bytes + (m.tried.value_bytes if m.tried is not None else 0)
    differs = needed is not None and needed > predicted + margin
    inferred = _infer(s, launch, step_phase, needed) if differs else ()
    where = f"in the {step_phase.value} phase" if step_phase else f"({phase_text})"
    usable = s.gpu.total_memory_bytes - sum(result.components.get(k, 0) for k in (  # what tensors may use
        MemCategory.OUTSIDE_PYTORCH, MemCategory.ALLOCATOR_OVERHEAD))
    earlier = [_phase_bytes(result, p) for p in _ORDER[:_ORDER.index(step_phase)]] if step_phase else []
    dead = next(((p, b) for p, b in earlier if b > usable), None)
    if dead is not None:  # the setup as read dies before the phase the run reached
        p, held = dead
        sentence = (f"The message shows the run reached the {step_phase.value} phase ({format_size(needed or 0)} "
                    f"needed there); the setup as read would already fail in the {p.value} phase, at "
                    f"{format_size(held)} allocated: the run that died differed from the setup as read.")
        return MessageReading(step_phase, phase_text, needed, p, held, margin, True, (), sentence), exp
    if needed is None:
        sentence = (f"The message prints no allocated figure to set against the budget; the setup as read predicts "
                    f"{format_size(predicted)} allocated at its {predicted_phase.value} peak.")
    elif differs:
        sentence = (f"The message shows {format_size(needed)} needed {where} (already allocated + the request); the "
                    f"setup as read predicts {format_size(predicted)} there, {format_size(margin)} margin included "
                    f"{format_size(predicted + margin)}: the run that died differed from the setup as read.")
        if inferred:
            sentence += " A setting the files leave open explains it: " + ", ".join(
                f"{name} {value} or more (assumed {getattr(s, name)})" for name, value in inferred) + "."
    else:
        sentence = (f"The message shows {format_size(needed)} needed {where}; the setup as read predicts "
                    f"{format_size(predicted)} at that phase's peak: consistent with the launch as read (the run "
                    "died on its way there).")
    return MessageReading(step_phase, phase_text, needed, predicted_phase, predicted, margin, differs, inferred,
                          sentence), exp
