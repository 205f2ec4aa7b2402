"""What the program was doing when it ran out of memory, from the traceback's frames."""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomlab.core.choices import Choice
from oomlab.explanation.frames import Frame
from oomlab.explanation.torch_versions import is_module_py


class PhaseCode(Choice):
    """What the traceback shows the program doing when it ran out of memory.

    The training-step members are budget's ``Phase`` (``oomlab.budget.result.Phase``: same names, same values; a
    test keeps them so); the explanation comes before the budget, so it names them without importing it.
    """

    MOVE = "move"  # Module.to / .cuda() → _apply → convert: moving the model, not training it
    LOAD = "load"  # load_state_dict, from_pretrained's loaders, accelerate's dispatch
    FORWARD = "forward"  # the forward pass
    BACKWARD = "backward"  # autograd's backward
    OPTIMIZER = "optimizer"  # the optimizer step

    @property
    def in_step(self) -> bool:
        """A phase of a training step (forward, backward, the optimizer step): one the budget breaks down."""
        return self in (PhaseCode.FORWARD, PhaseCode.BACKWARD, PhaseCode.OPTIMIZER)


@dataclass(frozen=True)
class TracebackPhase:
    """What the program was doing, from the traceback's frames."""

    code: PhaseCode
    text: str
    evidence: tuple[str, ...]  # the frames that show it


_PHASES = {
    PhaseCode.MOVE: "moving the model to the GPU (Module.to → _apply → convert), not training it",
    PhaseCode.LOAD: "loading weights onto the GPU",
    PhaseCode.FORWARD: "the forward pass",
    PhaseCode.BACKWARD: "the backward pass (autograd)",
    PhaseCode.OPTIMIZER: "the optimizer step",
}

_LOAD_FUNCS = {"load_state_dict", "_load_state_dict_into_meta_model", "set_module_tensor_to_device",
               "load_checkpoint_and_dispatch", "load_checkpoint_in_model", "_load_from_state_dict"}

_FORWARD_FUNCS = {"forward", "_call_impl", "_wrapped_call_impl", "generate", "__call__"}

_BACKWARD_FUNCS = {"backward", "run_backward", "_engine_run_backward", "grad"}

_CODE_HINTS = (
    (re.compile(r"\.backward\(|run_backward\(|autograd\.grad\("), PhaseCode.BACKWARD),
    (re.compile(r"(?:optimizer|optim|opt)\w{0,20}\.step\("), PhaseCode.OPTIMIZER),
    (re.compile(r"\bmodel\w{0,20}\.(?:to|cuda)\("), PhaseCode.MOVE),
)


def _frame_phase(f: Frame) -> PhaseCode | None:
    path = f.file.replace("\\", "/")
    if is_module_py(path) and f.function in {"_apply", "convert", "to", "cuda", "half", "float", "bfloat16"}:
        return PhaseCode.MOVE
    if f.function in _LOAD_FUNCS or (path.endswith("torch/serialization.py") and f.function == "load"):
        return PhaseCode.LOAD
    if "/torch/optim/" in path or f.function in {"_multi_tensor_adam", "_multi_tensor_adamw", "_single_tensor_adam",
                                                 "_single_tensor_adamw", "_init_group"}:
        return PhaseCode.OPTIMIZER
    if f.function in _BACKWARD_FUNCS or "/torch/autograd/" in path:
        return PhaseCode.BACKWARD
    for pattern, phase in _CODE_HINTS:
        if pattern.search(f.code):
            return phase
    if f.function in _FORWARD_FUNCS:
        return PhaseCode.FORWARD
    return None


def detect_phase(frames: tuple[Frame, ...]) -> TracebackPhase | None:
    """The phase the outermost phase-telling frame shows (a forward inside a backward is recomputation)."""
    for i, f in enumerate(frames):
        phase = _frame_phase(f)
        if phase is not None:
            evidence = tuple(
                f"{g.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{g.line} in {g.function}"
                + (f": {g.code[:80]}" if g.code else "")
                for g in frames[i:i + 4] if _frame_phase(g) is not None
            )
            return TracebackPhase(phase, _PHASES[phase], evidence)
    return None
