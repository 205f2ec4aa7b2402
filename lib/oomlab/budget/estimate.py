"""The public budget: :func:`estimate` of a setup given by names, analytic (microseconds) or traced (seconds)."""

from __future__ import annotations

from collections.abc import Sequence

from oomlab.budget.analytic import estimate_setup
from oomlab.budget.result import SOURCES, BudgetResult, Source
from oomlab.budget.traced import traced_budget
from oomlab.core.errors import UnknownNameError
from oomlab.core.setup import DEFAULT_LORA_TARGETS, make_setup


def estimate(
    model: str = "llama-13b",
    gpu: str = "t4",
    gpus: int = 1,
    nodes: int = 1,
    strategy: str = "single",
    method: str = "full",
    precision: str = "fp16-mixed",
    optimizer: str = "adamw",
    batch: int = 1,
    seq: int = 2048,
    checkpointing: bool = False,
    attention: str = "sdpa",
    lora_rank: int = 8,
    lora_alpha: int = 16,
    lora_targets: Sequence[str] | str = DEFAULT_LORA_TARGETS,
    source: str = "analytic",
    outside_bytes: int | None = None,
) -> BudgetResult:
    """Per-GPU memory of one training step of ``model`` on ``gpus`` × ``gpu`` (see :func:`make_setup`).

    ``source="traced"`` runs PyTorch's MemTracker on fake tensors instead (seconds; :mod:`oomlab.budget.traced`).
    """
    if source not in SOURCES:
        raise UnknownNameError("source", source, SOURCES)
    setup = make_setup(model=model, gpu=gpu, gpus=gpus, nodes=nodes, strategy=strategy, method=method,
                       precision=precision, optimizer=optimizer, batch=batch, seq=seq, checkpointing=checkpointing,
                       attention=attention, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets)
    if source == Source.ANALYTIC.value:
        return estimate_setup(setup, outside_bytes)
    return traced_budget(setup, outside_bytes)
