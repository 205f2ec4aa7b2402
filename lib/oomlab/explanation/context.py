"""What the caller says about the run that no out-of-memory message states: the world size, the strategy, the method,
the optimizer, the micro-batch and the sequence length -- each optional (``None``: not said)."""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.core.choices import Method, Optimizer, Strategy


@dataclass(frozen=True)
class RunContext:
    """The run around a message, as far as the caller told it; ``None`` where it did not."""

    world_size: int | None = None  # GPUs in the job (GPUs per node × nodes): what ZeRO and FSDP divide by
    strategy: Strategy | None = None
    method: Method | None = None
    optimizer: Optimizer | None = None
    batch: int | None = None  # micro-batch per GPU
    seq: int | None = None  # sequence length in tokens
