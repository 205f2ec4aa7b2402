"""Remediations: every realistic way to train a model on the given GPUs, budgeted, ranked and explained.

:func:`make_plan` enumerates strategy × method × precision × optimizer × checkpointing (offload is the
``fsdp-offload`` strategy) plus accelerate's ``device_map="auto"`` route, drops what the hardware cannot run (with
:func:`oomlab.core.setup.make_setup`'s own message), budgets each (:mod:`.remedy`), searches the largest micro-batch
and the longest sequence that fit, estimates throughput (:mod:`.throughput`), and ranks the remedies that fit by
tokens per second.  :func:`oomlab.remedies.knobs.knob_table` starts from the user's configuration and changes one
knob, then two: "the configuration that determines the result".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from oomlab.core.choices import Method, Optimizer, Precision, Route, Strategy
from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import GPUSpec, load_gpu
from oomlab.core.models import ModelSpec, load_model
from oomlab.core.setup import DEFAULT_HOST_RAM, TrainingSetup, make_setup
from oomlab.core.units import format_size, parse_size
from oomlab.remedies.knobs import KnobChange, knob_table
from oomlab.remedies.placement import DeviceMapPlacement, place_device_map
from oomlab.remedies.remedy import MAX_BATCH_SEARCH, Evaluator, Remedy, dropped_remedy, evaluate_remedy
from oomlab.remedies.throughput import DEFAULT_ASSUMPTIONS, Assumptions, describe_assumptions
from oomlab.reproduction.outside import case_outside
from oomlab.reproduction.walk import unlimited_walk


@dataclass(frozen=True)
class Plan:
    """Every remedy for one model on one set of GPUs, ranked."""

    model: str
    gpu: str
    gpus: int
    nodes: int
    seq: int
    host_ram_bytes: int
    seed: Remedy  # the user's configuration
    remedies: tuple[Remedy, ...]  # ranked: fitting by tokens/s, then the rest by per-GPU peak
    dropped: tuple[Remedy, ...]  # what the hardware cannot run, with the reason
    knobs: tuple[KnobChange, ...]  # single changes, then the minimal pairs that fit
    device_map: DeviceMapPlacement | None  # the placement of the best device_map remedy (or the seed's)
    assumptions: tuple[str, ...]
    seq_note: str  # how the sequence searches are capped
    lora_rank: int = 8

    @property
    def fitting(self) -> tuple[Remedy, ...]:
        return tuple(r for r in self.remedies if r.fits)

    @property
    def recommended(self) -> Remedy | None:
        """The fastest remedy that fits without a harmful caveat and that oomlab writes launch files for."""
        return next((r for r in self.remedies if r.recommendable and r.config_files), None)

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {"model": self.model, "gpu": self.gpu, "gpus": self.gpus, "nodes": self.nodes, "seq": self.seq,
                "host_ram_bytes": self.host_ram_bytes, "seed": self.seed.to_dict(),
                "remedies": [r.to_dict() for r in self.remedies], "dropped": [r.to_dict() for r in self.dropped],
                "knobs": [k.to_dict() for k in self.knobs],
                "device_map": None if self.device_map is None else self.device_map.to_dict(),
                "recommended": None if rec is None else rec.to_dict(), "assumptions": list(self.assumptions),
                "seq_note": self.seq_note, "lora_rank": self.lora_rank}


def seed_setup(model: str | ModelSpec, gpu: str | GPUSpec, gpus: int, nodes: int = 1, *, seq: int = 2048,
               batch: int = 1, precision: str = "fp16-mixed", optimizer: str = "adamw", checkpointing: bool = False,
               attention: str = "sdpa", lora_rank: int = 8) -> TrainingSetup:
    """The seed's configuration: a full replica per GPU (``model.to('cuda')`` in each process), full fine-tuning."""
    return make_setup(model=model, gpu=gpu, gpus=gpus, nodes=nodes,
                      strategy="ddp" if gpus * nodes > 1 else "single", method="full", precision=precision,
                      optimizer=optimizer, batch=batch, seq=seq, checkpointing=checkpointing, attention=attention,
                      lora_rank=lora_rank)


def _seed_reason(remedy: Remedy, setup: TrainingSetup) -> str:
    """The seed row's reason: the replica alone, as notebook 01 reproduced, then the step."""
    try:
        need = unlimited_walk(setup.model.name, "float16")[-1].reserved_bytes
    except Exception:  # noqa: BLE001 - a model given by path: state the step only
        return remedy.reason
    usable = setup.gpu.total_memory_bytes - case_outside(setup.model.name, setup.gpu, setup.world_size).context_bytes
    where = "fails before training: " if need > usable else ""
    return (f"{where}model.to('cuda') of the fp16 replica reserves {format_size(need)} on each GPU, "
            f"{format_size(usable)} usable (notebook 01); the training step: {remedy.reason}")


def _rank_key(r: Remedy) -> tuple:
    """Fitting first, sound before caveated, faster first (to 3 significant figures: the estimate is no finer);
    ties to plain AdamW (8-bit states save little on adapters and add a dependency), then the smaller peak."""
    tps = float(f"{r.tokens_per_s:.3g}") if r.tokens_per_s else 0.0
    return (not r.fits, not r.recommendable, -tps, not r.optimizer.adam, r.per_gpu_peak_bytes or 0)


def make_plan(
    model: str | ModelSpec = "llama-13b",
    gpu: str | GPUSpec = "t4",
    gpus: int = 4,
    nodes: int = 1,
    host_ram: str | int = DEFAULT_HOST_RAM,
    seq: int = 2048,
    *,
    batch: int = 1,
    precision: str = "fp16-mixed",
    optimizer: str = "adamw",
    checkpointing: bool = False,
    attention: str = "sdpa",
    lora_rank: int = 8,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    outside_bytes: int | None = None,
) -> Plan:
    """Every remedy for training ``model`` on ``nodes`` × ``gpus`` × ``gpu``, budgeted and ranked.

    The user's configuration (``seed_setup``: a full replica per GPU, full fine-tuning with the given precision,
    optimizer, micro-batch and checkpointing) is the seed row and the knob table's baseline.
    """
    host_ram_bytes = parse_size(host_ram)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    gpu_spec = gpu if isinstance(gpu, GPUSpec) else load_gpu(gpu)
    if seq > spec.max_position_embeddings:
        raise InvalidValueError(f"invalid seq {seq}; {spec.name} has max_position_embeddings "
                                f"{spec.max_position_embeddings}: use a sequence length up to that")
    base = seed_setup(spec, gpu_spec, gpus, nodes, seq=seq, batch=batch, precision=precision, optimizer=optimizer,
                      checkpointing=checkpointing, attention=attention, lora_rank=lora_rank)
    evaluator = Evaluator(host_ram_bytes, outside_bytes)
    seed = evaluate_remedy(base, host_ram_bytes, assumptions=assumptions, evaluator=evaluator)
    seed = replace(seed, reason=_seed_reason(seed, base), name="the seed's configuration: " + seed.name)
    remedies, dropped = [], []
    routes = [(Route.PROCESS_PER_GPU, s) for s in Strategy] + [(Route.DEVICE_MAP, Strategy.SINGLE)]
    grid = itertools.product(routes, Method, Precision, Optimizer, (False, True))
    for (route, strategy), method, prec, opt, ckpt in grid:
        if route is Route.DEVICE_MAP and nodes > 1:
            continue  # device_map places within one node
        try:
            setup = make_setup(model=spec, gpu=gpu_spec, gpus=gpus, nodes=nodes, strategy=strategy, method=method,
                               precision=prec, optimizer=opt, batch=batch, seq=seq, checkpointing=ckpt,
                               attention=attention, lora_rank=lora_rank)
        except InvalidValueError as err:
            dropped.append(dropped_remedy(route, strategy, method, prec, opt, ckpt, lora_rank, f"dropped: {err}"))
            continue
        remedies.append(evaluate_remedy(setup, host_ram_bytes, route=route, assumptions=assumptions,
                                        evaluator=evaluator))
    remedies.sort(key=_rank_key)
    knobs = knob_table(base, host_ram_bytes, evaluator=evaluator)
    dm = next((r for r in remedies if r.route is Route.DEVICE_MAP and r.recommendable), None)
    dm = dm or next((r for r in remedies if r.route is Route.DEVICE_MAP), None)
    placement = None if dm is None or dm.setup is None else place_device_map(dm.setup)
    seq_note = (f"sequence searches stop at {spec.name}'s max_position_embeddings = {spec.max_position_embeddings} "
                f"(RoPE was trained to that length); micro-batch searches at {MAX_BATCH_SEARCH}")
    return Plan(model=spec.name, gpu=gpu_spec.name, gpus=gpus, nodes=nodes, seq=seq, host_ram_bytes=host_ram_bytes,
                seed=seed, remedies=tuple(remedies), dropped=tuple(dropped), knobs=knobs, device_map=placement,
                assumptions=tuple(describe_assumptions(gpu_spec, assumptions))
                + (f"host RAM {format_size(host_ram_bytes)} per node (assumption unless given)",),
                seq_note=seq_note, lora_rank=lora_rank)


def distinct_top(plan: Plan, n: int = 3) -> tuple[Remedy, ...]:
    """The best recommendable remedy of each (route, strategy, method), best first, ``n`` of them."""
    seen, out = set(), []
    for r in plan.remedies:
        if r.recommendable and (r.route, r.strategy, r.method) not in seen and r.config_files:
            seen.add((r.route, r.strategy, r.method))
            out.append(r)
    return tuple(out[:n])
