"""The configuration that determines the result: the user's configuration with one knob changed, then every pair of
changes that fits although neither change fits alone."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from oomlab.core.choices import BaseDtype, Method, Optimizer, Precision, Route, Strategy, plain
from oomlab.core.errors import InvalidValueError
from oomlab.core.setup import TORCHTUNE_PRECISIONS, TrainingSetup, make_setup, torchtune_strategies
from oomlab.remedies.remedy import Evaluator, reason

# a knob's value: the member (or number) of the setup field it changes; the strategy knob also takes accelerate's
# device_map route (one process, strategy single), never paired with a strategy
KnobValue = Strategy | Route | Method | Precision | Optimizer | bool | int
# on one GPU these run what `single` runs (sharding or replicating over one GPU, device_map onto it): not knobs
ONE_GPU_SKIPPED = (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP, Strategy.FSDP2,
                   Route.DEVICE_MAP)

KNOB_VALUES: dict[str, tuple[KnobValue, ...]] = {
    "strategy": (Strategy.SINGLE, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.ZERO2_OFFLOAD,
                 Strategy.ZERO3_OFFLOAD, Strategy.FSDP, Strategy.FSDP_OFFLOAD, Strategy.FSDP2, Strategy.FSDP2_OFFLOAD,
                 Route.DEVICE_MAP),
    "method": (Method.LORA, Method.QLORA),
    "precision": (Precision.FP32, Precision.FP16, Precision.BF16_MIXED, Precision.BF16),
    "optimizer": (Optimizer.ADAMW, Optimizer.ADAMW_FUSED, Optimizer.ADAMW_8BIT, Optimizer.SGD),
    "checkpointing": (True,),
    "seq": (1024, 512),
}


@dataclass(frozen=True)
class KnobChange:
    """One row of the knob table: the user's configuration with one or two knobs changed.

    ``setup`` and ``route`` are the changed configuration, what a reader of the row acts on; ``changes`` is its text
    (for display and JSON only).  Both are None where the change is refused (``dropped``) and in a row read back from
    JSON, which keeps the text alone."""

    changes: tuple[tuple[str, str], ...]  # (knob, new value) as shown
    per_gpu_peak_bytes: int | None
    host_ram_bytes: int | None
    fits: bool
    reason: str
    setup: TrainingSetup | None = field(default=None, repr=False, compare=False)
    route: Route | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"changes": [list(c) for c in self.changes], "per_gpu_peak_bytes": self.per_gpu_peak_bytes,
                "host_ram_bytes": self.host_ram_bytes, "fits": self.fits, "reason": self.reason}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> KnobChange:
        return cls(tuple((str(k), str(v)) for k, v in raw["changes"]), raw["per_gpu_peak_bytes"],
                   raw["host_ram_bytes"], bool(raw["fits"]), raw["reason"])


def _knob_setup(base: TrainingSetup, changes: Sequence[tuple[str, KnobValue]]) -> tuple[TrainingSetup, Route]:
    kwargs: dict[str, Any] = {"model": base.model, "gpu": base.gpu, "gpus": base.gpus, "nodes": base.nodes,
                              "strategy": base.strategy, "method": base.method, "precision": base.precision,
                              "optimizer": base.optimizer, "batch": base.batch, "seq": base.seq,
                              "checkpointing": base.checkpointing, "attention": base.attention,
                              "lora_rank": base.lora_rank, "lora_alpha": base.lora_alpha,
                              "lora_targets": base.lora_targets,
                              # the run's loop, stack, loss and load, kept by every knob (the plan's KEPT and more)
                              "trainer": base.trainer, "reference": base.reference, "versions": base.versions,
                              "loss": base.loss, "offload_activations": base.offload_activations,
                              "base_dtype": base.base_dtype, "optimizer_in_backward": base.optimizer_in_backward}
    route = Route.PROCESS_PER_GPU
    for knob, value in changes:
        if value is Route.DEVICE_MAP:
            route, value = Route.DEVICE_MAP, Strategy.SINGLE
        kwargs[knob] = value
    if Precision(kwargs["precision"]) in (Precision.FP16, Precision.BF16):  # pure half: the weights are loaded in it
        kwargs["base_dtype"] = BaseDtype.HALF
    return make_setup(**kwargs), route


def _shown(knob: str, value: KnobValue) -> tuple[str, str]:
    return knob, str(value).lower() if isinstance(value, bool) else str(plain(value))


def _runs(base: TrainingSetup, knob: str, value: KnobValue) -> bool:
    """Can the user's framework run the change? torchtune's recipes: its strategies and dtypes only."""
    if base.versions.framework != "torchtune":
        return True
    if knob == "strategy":
        return value in torchtune_strategies(base)
    return knob != "precision" or value in TORCHTUNE_PRECISIONS


def knob_table(base: TrainingSetup, host_ram_bytes: int, outside_bytes: int | None = None,
               evaluator: Evaluator | None = None) -> tuple[KnobChange, ...]:
    """Single-knob changes of ``base``, then every pair that fits although neither of its changes fits alone (a
    torchtune run's: those its recipes can run)."""
    ev_fn = evaluator or Evaluator(host_ram_bytes, outside_bytes)
    singles = [(k, v) for k, values in KNOB_VALUES.items() for v in values if getattr(base, k) != v
               and not (base.world_size == 1 and v in ONE_GPU_SKIPPED) and _runs(base, k, v)]

    def row(changes: tuple[tuple[str, KnobValue], ...]) -> KnobChange:
        shown = tuple(_shown(k, v) for k, v in changes)
        try:
            setup, route = _knob_setup(base, changes)
        except InvalidValueError as err:
            return KnobChange(shown, None, None, False, f"dropped: {err}")
        ev = ev_fn(setup, route=route)
        return KnobChange(shown, ev.per_gpu_peak_bytes, ev.host_ram_bytes, ev.fits, reason(ev, setup, host_ram_bytes),
                          setup, route)

    rows = [row((change,)) for change in singles]
    fitting_single = [change for change, r in zip(singles, rows, strict=True) if r.fits]
    pairs = []
    for (k1, v1), (k2, v2) in itertools.combinations(singles, 2):
        if k1 == k2:
            continue
        if (k1, v1) in fitting_single or (k2, v2) in fitting_single:
            continue  # not minimal: one change alone already fits
        r = row(((k1, v1), (k2, v2)))
        if r.fits:
            pairs.append(r)
    pairs.sort(key=lambda r: r.per_gpu_peak_bytes or 0)
    return tuple(rows + pairs)
