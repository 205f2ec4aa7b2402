"""What a reproduction returns: the outcome of ``model.to("cuda")``, its failing tensor, and the figures of the
message beside the seed's."""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from oomlab.core.seed import seed_figures
from oomlab.core.units import format_size
from oomlab.reproduction.steps import TensorKind, WalkStep


@dataclass(frozen=True)
class FailingTensor:
    """The tensor whose copy to the device failed."""

    name: str
    kind: TensorKind
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class ReproduceResult:
    """What happened when the model was moved to the device."""

    model: str
    gpu: str
    dtype: str
    device: str  # "simulated" or "cuda (...)"
    message_format: str  # a MessageFormat value
    raised: bool
    exception: str | None  # "torch.OutOfMemoryError" when raised
    message: str | None
    tried_bytes: int | None  # the "Tried to allocate" segment
    allocated_bytes: int  # allocator's allocated bytes at the end (at the failure if raised)
    reserved_bytes: int
    free_bytes: int  # device free memory at the end
    total_bytes: int  # device capacity ("total capacity")
    outside_pytorch_bytes: int  # memory on the GPU held outside this process's allocator
    outside_pytorch_source: str  # where that figure comes from
    failing_tensor: FailingTensor | None
    moved_bytes: int  # tensor bytes copied before the failure (all, if none)
    moved_parameters: int
    model_bytes: int  # the whole model's tensor bytes in this dtype
    model_parameters: int
    model_reserved_bytes: int  # what the allocator reserves for the whole model (unlimited walk)
    fits: bool  # whether the whole model fits this GPU's free memory in this dtype
    frames: tuple[str, ...]  # traceback function names, innermost last
    traceback: tuple[tuple[str, int, str], ...]  # (file, line, function), innermost last
    steps: tuple[WalkStep, ...] = field(repr=False)  # the walk as far as it went

    @property
    def moved_fraction(self) -> float:
        """Fraction of the model's parameters moved before the failure."""
        return self.moved_parameters / self.model_parameters

    def to_dict(self, include_steps: bool = False) -> dict[str, Any]:
        """JSON-ready dict (``steps`` left out unless asked for)."""
        data = asdict(self)
        if include_steps:
            for step in data["steps"]:
                step["kind"] = step["kind"].value
        else:
            data.pop("steps")
        data["moved_fraction"] = self.moved_fraction
        data["traceback"] = [list(t) for t in self.traceback]
        data["frames"] = list(self.frames)
        if self.failing_tensor is not None:
            data["failing_tensor"]["shape"] = list(self.failing_tensor.shape)
            data["failing_tensor"]["kind"] = self.failing_tensor.kind.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReproduceResult:
        """The result :meth:`to_dict` wrote (the results JSON), typed again; the walk's steps only where written."""
        known = {f for f in cls.__dataclass_fields__} - {"failing_tensor", "frames", "traceback", "steps"}
        ft = data.get("failing_tensor")
        failing = None if ft is None else FailingTensor(name=ft["name"], kind=TensorKind(ft["kind"]),
                                                        shape=tuple(ft["shape"]), dtype=ft["dtype"],
                                                        nbytes=int(ft["nbytes"]))
        steps = tuple(WalkStep(**{**step, "kind": TensorKind(step["kind"]), "shape": tuple(step["shape"])})
                      for step in data.get("steps", ()))
        return cls(**{k: data[k] for k in known}, failing_tensor=failing, frames=tuple(data["frames"]),
                   traceback=tuple((str(f), int(n), str(fn)) for f, n, fn in data["traceback"]), steps=steps)


def traceback_frames(error: BaseException) -> tuple[tuple[str, int, str], ...]:
    """``(file, line, function)`` of each frame of ``error``'s traceback, innermost last."""
    return tuple((f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(error.__traceback__))


@dataclass(frozen=True)
class FigureComparison:
    """One figure of the OOM message: the seed's text beside the reproduction's."""

    figure: str
    seed: str
    reproduced: str | None

    @property
    def matches(self) -> bool:
        return self.seed == self.reproduced


def compare_with_seed(result: ReproduceResult) -> list[FigureComparison]:
    """The seed's five figures beside the reproduced ones, as printed by ``format_size``."""
    seed = seed_figures()

    def fmt(value: int | None) -> str | None:
        return None if value is None else format_size(value)

    return [
        FigureComparison("Tried to allocate", seed.tried, fmt(result.tried_bytes)),
        FigureComparison("total capacity", seed.total, fmt(result.total_bytes)),
        FigureComparison("already allocated", seed.allocated, fmt(result.allocated_bytes)),
        FigureComparison("free", seed.free, fmt(result.free_bytes)),
        FigureComparison("reserved in total by PyTorch", seed.reserved, fmt(result.reserved_bytes)),
    ]
