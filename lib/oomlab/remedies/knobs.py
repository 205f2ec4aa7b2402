"""The configuration that determines the result: the user's configuration with one knob changed, then every pair of
changes that fits although neither change fits alone."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oomlab.core.choices import Route
from oomlab.core.errors import InvalidValueError
from oomlab.core.setup import TrainingSetup, make_setup
from oomlab.remedies.remedy import Evaluator, reason

DEVICE_MAP_KNOB = Route.DEVICE_MAP.value  # the "strategy" knob's value for accelerate's device_map route
# on one GPU these run what `single` runs (sharding or replicating over one GPU, device_map onto it): not knobs
ONE_GPU_SKIPPED = ("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp2", DEVICE_MAP_KNOB)

KNOB_VALUES: dict[str, tuple[Any, ...]] = {
    "strategy": ("single", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "fsdp", "fsdp-offload",
                 "fsdp2", "fsdp2-offload", DEVICE_MAP_KNOB),
    "method": ("lora", "qlora"),
    "precision": ("fp32", "fp16", "bf16-mixed", "bf16"),
    "optimizer": ("adamw", "adamw-fused", "adamw-8bit", "sgd"),
    "checkpointing": (True,),
    "seq": (1024, 512),
}


@dataclass(frozen=True)
class KnobChange:
    """One row of the knob table: the user's configuration with one or two knobs changed."""

    changes: tuple[tuple[str, str], ...]  # (knob, new value)
    per_gpu_peak_bytes: int | None
    host_ram_bytes: int | None
    fits: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"changes": [list(c) for c in self.changes], "per_gpu_peak_bytes": self.per_gpu_peak_bytes,
                "host_ram_bytes": self.host_ram_bytes, "fits": self.fits, "reason": self.reason}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> KnobChange:
        return cls(tuple((str(k), str(v)) for k, v in raw["changes"]), raw["per_gpu_peak_bytes"],
                   raw["host_ram_bytes"], bool(raw["fits"]), raw["reason"])


def _knob_setup(base: TrainingSetup, changes: Sequence[tuple[str, Any]]) -> tuple[TrainingSetup, Route]:
    kwargs: dict[str, Any] = {"model": base.model, "gpu": base.gpu, "gpus": base.gpus, "nodes": base.nodes,
                              "strategy": base.strategy, "method": base.method, "precision": base.precision,
                              "optimizer": base.optimizer, "batch": base.batch, "seq": base.seq,
                              "checkpointing": base.checkpointing, "attention": base.attention,
                              "lora_rank": base.lora_rank, "lora_alpha": base.lora_alpha,
                              "lora_targets": base.lora_targets}
    route = Route.PROCESS_PER_GPU
    for knob, value in changes:
        if knob == "strategy" and value == DEVICE_MAP_KNOB:
            route, value = Route.DEVICE_MAP, "single"
        kwargs[knob] = value
    return make_setup(**kwargs), route


def _current(setup: TrainingSetup, knob: str) -> Any:
    value = getattr(setup, knob)
    return getattr(value, "value", value)


def _shown(knob: str, value: Any) -> tuple[str, str]:
    return knob, str(value).lower() if isinstance(value, bool) else str(value)


def knob_table(base: TrainingSetup, host_ram_bytes: int, outside_bytes: int | None = None,
               evaluator: Evaluator | None = None) -> tuple[KnobChange, ...]:
    """Single-knob changes of ``base``, then every pair that fits although neither of its changes fits alone."""
    ev_fn = evaluator or Evaluator(host_ram_bytes, outside_bytes)
    singles = [(k, v) for k, values in KNOB_VALUES.items() for v in values if _current(base, k) != v
               and not (k == "strategy" and base.world_size == 1 and v in ONE_GPU_SKIPPED)]

    def row(changes: tuple[tuple[str, Any], ...]) -> KnobChange:
        shown = tuple(_shown(k, v) for k, v in changes)
        try:
            setup, route = _knob_setup(base, changes)
        except InvalidValueError as err:
            return KnobChange(shown, None, None, False, f"dropped: {err}")
        ev = ev_fn(setup, route=route)
        return KnobChange(shown, ev.per_gpu_peak_bytes, ev.host_ram_bytes, ev.fits, reason(ev, setup, host_ram_bytes))

    rows = [row(((k, v),)) for k, v in singles]
    fitting_single = {r.changes[0] for r in rows if r.fits}
    pairs = []
    for (k1, v1), (k2, v2) in itertools.combinations(singles, 2):
        if k1 == k2:
            continue
        if _shown(k1, v1) in fitting_single or _shown(k2, v2) in fitting_single:
            continue  # not minimal: one change alone already fits
        r = row(((k1, v1), (k2, v2)))
        if r.fits:
            pairs.append(r)
    pairs.sort(key=lambda r: r.per_gpu_peak_bytes or 0)
    return tuple(rows + pairs)
