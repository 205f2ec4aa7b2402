"""Remediations: every realistic way to train a model on the given GPUs, budgeted, ranked and explained.

:func:`make_plan` enumerates strategy × method × precision × optimizer × checkpointing (offload is a strategy:
``fsdp-offload``, ``fsdp2-offload``, DeepSpeed's ``zero2-offload`` and ``zero3-offload``; the ZeRO stages run with
the knobs the HF integration resolves ``"auto"`` to) plus accelerate's ``device_map="auto"`` route, drops what the
hardware cannot run (with :func:`oomlab.core.setup.make_setup`'s own message), budgets each (:mod:`.remedy`), searches
the largest micro-batch and the longest sequence that fit, estimates throughput (:mod:`.throughput`), and ranks the
remedies that fit by tokens per second.  :func:`oomlab.remedies.knobs.knob_table` starts from the user's
configuration and changes one knob, then two: "the configuration that determines the result".
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from oomlab.budget.result import Fit
from oomlab.core.choices import BaseDtype, Loss, Method, Optimizer, Precision, Reference, Route, Strategy, Trainer
from oomlab.core.defaults import DEFAULTS, launch_strategy
from oomlab.core.errors import InvalidValueError, OomlabError
from oomlab.core.gpus import GPUSpec, load_gpu
from oomlab.core.models import ModelSpec, load_model
from oomlab.core.prices import HOST_RAM_AUTO, resolve_host_ram
from oomlab.core.setup import TORCHTUNE_PRECISIONS, TrainingSetup, make_setup, torchtune_strategies, validate
from oomlab.core.units import format_size
from oomlab.core.versions import Versions, pin_text
from oomlab.remedies.knobs import KnobChange, knob_table
from oomlab.remedies.ladder import Decision, climb
from oomlab.remedies.launch_files import files_for
from oomlab.remedies.placement import DeviceMapPlacement, place_device_map
from oomlab.remedies.remedy import (
    MAX_BATCH_SEARCH,
    Evaluator,
    Remedy,
    caveats,
    dropped_remedy,
    evaluate_remedy,
    format_tokens_per_s,
)
from oomlab.remedies.throughput import DEFAULT_ASSUMPTIONS, Assumptions, describe_assumptions
from oomlab.reproduction.outside import case_outside
from oomlab.reproduction.replica import replica_reserved_bytes

# on one GPU these launch what `single` launches (a process group of one: nothing to replicate, shard or reduce);
# the offload strategies stay, as they move states to the host
MULTI_GPU_ONLY = frozenset({Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP,
                            Strategy.FSDP2})
ONE_GPU_NOTE = ("one GPU: DDP, DeepSpeed ZeRO-1/2/3, FSDP1/FSDP2 full shard and device_map='auto' are left out (over "
                "one GPU each runs what the single-GPU launch runs); the CPU-offload strategies stay")


HEADROOM_GAIN = 0.10  # a remedy about as fast is preferred for its headroom when it leaves this share of the GPU more


class Outcome(enum.Enum):
    """The plan's verdict, one per case."""

    FITS = "fits as configured"  # the user's configuration fits the GPUs and the host RAM, with the margin
    FIXED = "a remedy fits"  # a sound remedy that oomlab writes launch files for fits (the ladder's, with the margin)
    TIGHT = "fits only inside the margin"  # nothing fits with the margin; something fits by the estimate alone
    HOST_RAM = Fit.GPU_ONLY.value  # a sound remedy fits every GPU; the host RAM is too small
    HARMFUL_ONLY = "fits only with harmful changes"  # only pure half precision or SGD fit
    NOTHING = "nothing fits"  # no configuration oomlab knows fits the GPUs


@dataclass(frozen=True)
class Plan:
    """Every remedy for one model on one set of GPUs, ranked."""

    model: str
    gpu: str
    gpus: int
    nodes: int
    seq: int
    host_ram_bytes: int
    configured: Remedy  # the user's configuration (its row is named as the others are; displays say "as configured")
    remedies: tuple[Remedy, ...]  # ranked: fitting by tokens/s, then the rest by per-GPU peak
    dropped: tuple[Remedy, ...]  # what the hardware cannot run, with the reason
    knobs: tuple[KnobChange, ...]  # single changes, then the minimal pairs that fit
    device_map: DeviceMapPlacement | None  # the best device_map remedy's placement (else the first device_map row's)
    assumptions: tuple[str, ...]
    seq_note: str  # how the sequence searches are capped
    lora_rank: int = 8
    host_ram_source: str = "given"  # where the host RAM figure comes from
    host_ram_assumed: bool = False  # True: not given by the user (the GPUs' machine's, or the seed's)
    speed_uncertainty: float = 0.10  # speeds closer than this are not told apart (Assumptions.speed_uncertainty)
    notes: tuple[str, ...] = ()  # what the plan left out or folded together, and why
    decision: Decision | None = field(default=None, compare=False)  # the ladder on the configured run (issue 22)
    fix: Remedy | None = None  # the ladder's fix, budgeted: the recommendation, row 1 of every table shown

    @property
    def fitting(self) -> tuple[Remedy, ...]:
        return tuple(r for r in self.remedies if r.fits)

    @property
    def fastest(self) -> Remedy | None:
        """The fastest sound launchable remedy of the grid (:func:`recommend`): what the hardware search ranks, a
        different question from the fix of the user's run."""
        return recommend(self.remedies, self.speed_uncertainty)[0]

    @property
    def recommended(self) -> Remedy | None:
        """The remedy to launch: none when the run fits as configured with the margin (launch it as written), the
        ladder's fix when there is one, else the fastest sound one (:func:`recommend`)."""
        if self.decision is not None and self.decision.verdict.fits:
            return None
        return self.fix or self.fastest

    @property
    def shown(self) -> tuple[Remedy, ...]:
        """The table as shown: the ladder's fix first, then the grid ranked by speed."""
        return ((self.fix,) if self.fix is not None else ()) + self.remedies

    @property
    def recommendation_note(self) -> str:
        """Why the recommended remedy is the one it is (why not rank 1, when it is not)."""
        if self.decision is not None and self.decision.verdict.fits:
            return "it fits as configured, with the margin: nothing to change"
        if self.fix is not None:
            steps = "; ".join(s.words for s in self.decision.steps)
            margin = self.decision.fixed.margin.words
            return f"rank 1: the least disruptive change that fits with the margin ({margin}) -- {steps}"
        return recommend(self.remedies, self.speed_uncertainty)[1]

    @property
    def outcome(self) -> Outcome:
        if self.decision is not None and self.decision.verdict.fits or self.decision is None and self.configured.fits:
            return Outcome.FITS
        if self.fix is not None:
            return Outcome.FIXED
        if self.decision is not None and (self.decision.verdict.tight or self.decision.tight):
            return Outcome.TIGHT
        if self.recommended is not None:
            return Outcome.FIXED
        if self.host_ram_short:
            return Outcome.HOST_RAM
        if self.fitting:
            return Outcome.HARMFUL_ONLY
        return Outcome.NOTHING

    @property
    def host_ram_short(self) -> tuple[Remedy, ...]:
        """Sound launchable remedies that fit every GPU but not the host RAM, least host RAM first."""
        rows = [r for r in self.remedies if r.gpu_fits and not r.fits and not any(c.harmful for c in r.caveats)]
        return tuple(sorted(rows, key=lambda r: r.host_ram_bytes or 0))

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {"model": self.model, "gpu": self.gpu, "gpus": self.gpus, "nodes": self.nodes, "seq": self.seq,
                "host_ram_bytes": self.host_ram_bytes, "configured": self.configured.to_dict(),
                "remedies": [r.to_dict() for r in self.shown], "dropped": [r.to_dict() for r in self.dropped],
                "knobs": [k.to_dict() for k in self.knobs],
                "device_map": None if self.device_map is None else self.device_map.to_dict(),
                "recommended": None if rec is None else rec.to_dict(), "assumptions": list(self.assumptions),
                "seq_note": self.seq_note, "lora_rank": self.lora_rank, "host_ram_source": self.host_ram_source,
                "host_ram_assumed": self.host_ram_assumed, "outcome": self.outcome.value,
                "recommendation_note": self.recommendation_note, "notes": list(self.notes)}


def recommend(remedies: tuple[Remedy, ...], uncertainty: float = 0.10) -> tuple[Remedy | None, str]:
    """The remedy to launch and why: the best-ranked sound remedy that oomlab writes launch files for; among those
    whose estimated speed is within ``uncertainty`` of it, the one with the most headroom, if it has at least
    :data:`HEADROOM_GAIN` of the GPU more (a smaller gain is not worth a different launch)."""
    ranked = list(remedies)
    launchable = [r for r in ranked if r.recommendable and r.config_files]
    if not launchable:
        return None, ""
    best = launchable[0]
    capacity = (best.per_gpu_peak_bytes or 0) + (best.headroom_bytes or 0)
    close = [r for r in launchable if (r.tokens_per_s or 0) >= (best.tokens_per_s or 0) * (1 - uncertainty)
             and (r.headroom_bytes or 0) - (best.headroom_bytes or 0) >= HEADROOM_GAIN * capacity]
    chosen = max(close, key=lambda r: (r.headroom_bytes or 0, -ranked.index(r)), default=best)
    rank = ranked.index(chosen) + 1
    if rank == 1:
        return chosen, "rank 1: the fastest sound remedy that fits, and oomlab writes its launch files"
    reasons = []
    skipped = ranked[:ranked.index(best)]
    harmful = [r for r in skipped if r.fits and not r.recommendable]
    unlaunched = [r for r in skipped if r.recommendable and not r.config_files]
    if harmful:
        reasons.append(f"{len(harmful)} faster row(s) change training harmfully (e.g. {harmful[0].name}: "
                       + "; ".join(c.text for c in harmful[0].caveats if c.harmful) + ")")
    if unlaunched:
        reasons.append(f"oomlab writes no launch files for {', '.join(r.name for r in unlaunched[:2])}")
    if chosen is not best:
        reasons.append(f"{best.name} (rank {ranked.index(best) + 1}) is estimated at "
                       f"{format_tokens_per_s(best.tokens_per_s)} tokens/s and this one at "
                       f"{format_tokens_per_s(chosen.tokens_per_s)}: within the estimate's own uncertainty "
                       f"(±{uncertainty:.0%}: the MFU is assumed), so the one with more headroom "
                       f"({format_size(chosen.headroom_bytes or 0)} against {format_size(best.headroom_bytes or 0)})"
                       " is recommended")
    return chosen, f"rank {rank}, not rank 1: " + "; ".join(reasons)


_HALF_FAMILY = {Precision.FP16_MIXED: "mixed", Precision.BF16_MIXED: "mixed", Precision.FP16: "half",
                Precision.BF16: "half", Precision.FP32: "fp32"}
_ADAM_FAMILY = {Optimizer.ADAMW: "adamw", Optimizer.ADAMW_FUSED: "adamw"}


def _figures(r: Remedy) -> tuple:
    tps = None if r.tokens_per_s is None else float(f"{r.tokens_per_s:.3g}")
    return (r.route, r.strategy, r.method, r.checkpointing, _HALF_FAMILY[r.precision],
            _ADAM_FAMILY.get(r.optimizer, r.optimizer.value), r.fits, r.gpu_fits, r.per_gpu_peak_bytes,
            r.headroom_bytes, r.host_ram_bytes, r.max_batch, r.max_seq, tps, tuple(c.harmful for c in r.caveats),
            bool(r.config_files))


def _preference(r: Remedy, bf16: bool) -> tuple:
    """The label a user would launch: bf16 where the GPU has it (no loss scaling), AdamW fused (the HF Trainer's
    default, ``adamw_torch_fused``)."""
    return (r.precision.uses_bf16 != bf16, r.optimizer is not Optimizer.ADAMW_FUSED)


def fold_label_twins(remedies: list[Remedy], bf16: bool) -> list[Remedy]:
    """Rows that differ only in a label (fp16 vs bf16 of the same kind, adamw vs adamw-fused) and have the same
    figures, folded into one: the one a user would launch, the others named in its ``same_as``.  Order is kept."""
    groups: dict[tuple, list[Remedy]] = {}
    for r in remedies:
        groups.setdefault(_figures(r), []).append(r)
    keep = {}
    for rows in groups.values():
        chosen = min(rows, key=lambda r: _preference(r, bf16))
        keep[id(chosen)] = replace(chosen, same_as=tuple(r.name for r in rows if r is not chosen))
    return [keep[id(r)] for r in remedies if id(r) in keep]


# what no remedy changes: the training loop, its reference, the stack, the loss kernel, activation offloading (NB: the
# dtype a LoRA base was loaded in and an optimizer stepped in backward are the configured row's only: every remedy's
# train.py loads the base in half and steps after backward, and the ladder starts from the user's own run)
KEPT = ("trainer", "reference", "versions", "loss", "offload_activations")


def configured_setup(model: str | ModelSpec, gpu: str | GPUSpec, gpus: int, nodes: int = DEFAULTS.nodes, *,
                     seq: int = DEFAULTS.seq, batch: int = DEFAULTS.batch,
                     precision: str = DEFAULTS.precision.value, optimizer: str = DEFAULTS.optimizer.value,
                     checkpointing: bool = DEFAULTS.checkpointing, attention: str = DEFAULTS.attention.value,
                     lora_rank: int = DEFAULTS.lora_rank, strategy: str | Strategy | None = None,
                     method: str | Method = DEFAULTS.method,
                     lora_targets: str | tuple[str, ...] = DEFAULTS.lora_targets, lora_alpha: int = DEFAULTS.lora_alpha,
                     **run: Any) -> TrainingSetup:
    """The configuration as given; by default the seed's: a full replica per GPU (``model.to('cuda')`` in each
    process), full fine-tuning.  ``strategy`` None or ``ddp`` on one GPU is ``single``
    (:func:`oomlab.core.defaults.launch_strategy`, in :func:`make_setup`).  ``run``: what every remedy keeps of the
    user's run (:data:`KEPT`: the trainer, its reference model, the library versions)."""
    return make_setup(model=model, gpu=gpu, gpus=gpus, nodes=nodes, strategy=strategy, method=method,
                      precision=precision, optimizer=optimizer, batch=batch, seq=seq, checkpointing=checkpointing,
                      attention=attention, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets,
                      **run)


def _configured_row(remedy: Remedy, setup: TrainingSetup) -> Remedy:
    """The configured row: its reason says the replica alone, as notebook 01 reproduced (for launches that move one to
    each GPU), then the step; ``fails_at_load`` when that move already fails.  Not for QLoRA (bitsandbytes quantizes
    each weight as it moves: no half replica is ever on the GPU) nor under torchtune or litgpt (their own loading;
    torchtune 0.1's QLoRA init is the budget's :attr:`~oomlab.budget.result.BudgetResult.load`)."""
    if setup.strategy not in (Strategy.SINGLE, Strategy.DDP) or setup.method is Method.QLORA \
            or setup.versions.framework != "transformers":
        return remedy
    dtype = "float32" if setup.base_dtype is BaseDtype.FP32 and setup.method is not Method.FULL else "float16"
    try:
        need = replica_reserved_bytes(setup.model.name, dtype)
    except OomlabError:  # a model given by path, or one the walk cannot build: state the step only
        return remedy
    usable = setup.gpu.total_memory_bytes - case_outside(setup.model.name, setup.gpu, setup.world_size).context_bytes
    fails = need > usable
    where = "fails before training: " if fails else ""
    return replace(remedy, fails_at_load=fails, reason=(
        f"{where}model.to('cuda') of the {'fp32' if dtype == 'float32' else 'fp16'} replica reserves "
        f"{format_size(need)} on each GPU, "
        f"{format_size(usable)} usable (notebook 01); the training step: {remedy.reason}"))


def rank_key(fits: bool, recommendable: bool, tokens_per_s: float | None, optimizer: Optimizer,
             per_gpu_peak_bytes: int | None) -> tuple:
    """Fitting first, sound before caveated, faster first (to 3 significant figures: the estimate is no finer);
    ties to plain AdamW (8-bit states save little on adapters and add a dependency), then the smaller peak."""
    tps = float(f"{tokens_per_s:.3g}") if tokens_per_s else 0.0
    return (not fits, not recommendable, -tps, not optimizer.adam, per_gpu_peak_bytes or 0)


def _rank_key(r: Remedy) -> tuple:
    return rank_key(r.fits, r.recommendable, r.tokens_per_s, r.optimizer, r.per_gpu_peak_bytes)


@dataclass(frozen=True)
class Candidate:
    """One configuration of the plan's grid: its validated setup, or why the hardware cannot run it."""

    route: Route
    strategy: Strategy
    method: Method
    precision: Precision
    optimizer: Optimizer
    checkpointing: bool
    setup: TrainingSetup | None  # None: dropped
    why: str = ""  # "dropped: <make_setup's message>" when dropped

    @property
    def may_recommend(self) -> bool:
        """Could it be the plan's recommendation if it fits: no harmful caveat, and launch files are written."""
        return (self.setup is not None and bool(files_for(self.route, self.setup))
                and not any(c.harmful for c in caveats(self.setup)))


def plan_grid(spec: ModelSpec, gpu_spec: GPUSpec, gpus: int, nodes: int, *, batch: int, seq: int, attention: str,
              lora_rank: int, methods: Iterable[Method] = tuple(Method),
              precisions: Iterable[Precision] = tuple(Precision),
              optimizers: Iterable[Optimizer] = tuple(o for o in Optimizer if o.remedy),
              run: Mapping[str, Any] | None = None, routes: Iterable[Route] = tuple(Route)
              ) -> Iterator[Candidate]:
    """The plan's grid, in its order: route × strategy × method × precision × optimizer × checkpointing (each axis
    all its members unless narrowed: ``routes`` too), each validated by :func:`make_setup` (what it refuses is dropped
    with its message); ``run``: what every candidate keeps of the user's run (:data:`KEPT`)."""
    run = dict(run or {})
    one_gpu = gpus * nodes == 1  # no multi-GPU strategy on one GPU (ONE_GPU_NOTE)
    # every name looked up once: each candidate is this probe with its five axes, validated as make_setup validates
    probe = make_setup(model=spec, gpu=gpu_spec, gpus=gpus, nodes=nodes, batch=batch, seq=seq, attention=attention,
                       lora_rank=lora_rank, **run)
    searched = tuple(routes)
    pairs = [(Route.PROCESS_PER_GPU, s) for s in Strategy if not (one_gpu and s in MULTI_GPU_ONLY)] \
        if Route.PROCESS_PER_GPU in searched else []
    if not one_gpu and Route.DEVICE_MAP in searched:
        pairs.append((Route.DEVICE_MAP, Strategy.SINGLE))
    grid = itertools.product(pairs, tuple(methods), tuple(precisions), tuple(optimizers), (False, True))
    kept = {f.name: getattr(probe, f.name) for f in fields(probe)}  # what replace(probe, ...) copies, read once
    torchtune = probe.versions.framework == "torchtune"
    tune_strategies = torchtune_strategies(probe) if torchtune else ()
    for (route, strategy), method, prec, opt, ckpt in grid:
        if route is Route.DEVICE_MAP and nodes > 1:
            continue  # device_map places within one node
        if torchtune and (route is Route.DEVICE_MAP or launch_strategy(strategy, gpus * nodes) not in tune_strategies
                          or prec not in TORCHTUNE_PRECISIONS):
            yield Candidate(route, strategy, method, prec, opt, ckpt, None,
                            f"dropped: torchtune's recipes run {', '.join(s.value for s in tune_strategies)} in "
                            f"{' or '.join(p.value for p in TORCHTUNE_PRECISIONS)} only")
            continue
        try:
            setup = validate(TrainingSetup(**{**kept, "strategy": launch_strategy(strategy, gpus * nodes),
                                              "method": method, "precision": prec, "optimizer": opt,
                                              "checkpointing": ckpt}))
        except InvalidValueError as err:
            yield Candidate(route, strategy, method, prec, opt, ckpt, None, f"dropped: {err}")
            continue
        yield Candidate(route, strategy, method, prec, opt, ckpt, setup)


def make_plan(
    model: str | ModelSpec = DEFAULTS.model,
    gpu: str | GPUSpec = DEFAULTS.gpu,
    gpus: int = DEFAULTS.gpus,
    nodes: int = DEFAULTS.nodes,
    host_ram: str | int | None = HOST_RAM_AUTO,
    seq: int = DEFAULTS.seq,
    *,
    batch: int = DEFAULTS.batch,
    precision: str = DEFAULTS.precision.value,
    optimizer: str = DEFAULTS.optimizer.value,
    checkpointing: bool = DEFAULTS.checkpointing,
    attention: str = DEFAULTS.attention.value,
    lora_rank: int = DEFAULTS.lora_rank,
    strategy: str | Strategy | None = None,
    method: str | Method = DEFAULTS.method,
    lora_targets: str | tuple[str, ...] = DEFAULTS.lora_targets,
    lora_alpha: int = DEFAULTS.lora_alpha,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    outside_bytes: int | None = None,
    trainer: str | Trainer = DEFAULTS.trainer,
    reference: str | Reference = DEFAULTS.reference,
    versions: Versions | Mapping[str, str] | str | None = None,
    loss: str | Loss = DEFAULTS.loss,
    offload_activations: bool = DEFAULTS.offload_activations,
    base_dtype: str | BaseDtype = DEFAULTS.base_dtype,
    optimizer_in_backward: bool = DEFAULTS.optimizer_in_backward,
) -> Plan:
    """Every remedy for training ``model`` on ``nodes`` × ``gpus`` × ``gpu``, budgeted and ranked.

    The user's configuration (``configured_setup``: a full replica per GPU, full fine-tuning with the given precision,
    optimizer, micro-batch and checkpointing) is the configured row and the knob table's baseline.  ``host_ram``: a size
    with its unit, or ``"auto"`` / None for the host RAM of the listed instance with these GPUs
    (:func:`oomlab.core.prices.assumed_host_ram`).  On one GPU the multi-GPU strategies are left out; rows that
    differ only in a label are folded together (:func:`fold_label_twins`).
    """
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    gpu_spec = gpu if isinstance(gpu, GPUSpec) else load_gpu(gpu)
    host = resolve_host_ram(host_ram, gpu_spec.name, gpus)
    host_ram_bytes = host.host_ram_bytes
    if seq > spec.max_position_embeddings:
        raise InvalidValueError(f"invalid seq {seq}; {spec.name} has max_position_embeddings "
                                f"{spec.max_position_embeddings}: use a sequence length up to that")
    run = {"trainer": trainer, "reference": reference, "versions": versions, "loss": loss,
           "offload_activations": offload_activations}  # every remedy keeps these (KEPT)
    base = configured_setup(spec, gpu_spec, gpus, nodes, seq=seq, batch=batch, precision=precision,
                            optimizer=optimizer, checkpointing=checkpointing, attention=attention,
                            lora_rank=lora_rank, strategy=strategy, method=method, lora_targets=lora_targets,
                            lora_alpha=lora_alpha, base_dtype=base_dtype,
                            optimizer_in_backward=optimizer_in_backward, **run)
    run["versions"] = base.versions  # parsed once
    evaluator = Evaluator(host_ram_bytes, outside_bytes)
    configured = evaluate_remedy(base, host_ram_bytes, assumptions=assumptions, evaluator=evaluator)
    configured = _configured_row(configured, base)
    remedies, dropped = [], []
    for c in plan_grid(spec, gpu_spec, gpus, nodes, batch=batch, seq=seq, attention=attention, lora_rank=lora_rank,
                       run=run):
        if c.setup is None:
            dropped.append(dropped_remedy(c.route, c.strategy, c.method, c.precision, c.optimizer, c.checkpointing,
                                          lora_rank, c.why))
            continue
        remedies.append(evaluate_remedy(c.setup, host_ram_bytes, route=c.route, assumptions=assumptions,
                                        evaluator=evaluator))
    remedies.sort(key=_rank_key)
    budgeted = len(remedies)
    remedies = fold_label_twins(remedies, gpu_spec.bf16)
    notes = [f"{budgeted - len(remedies)} of {budgeted} rows differed from another only in a label (fp16 vs bf16 of "
             "the same kind, adamw vs adamw-fused) with the same figures: each such group is shown once, as the one "
             "a user would launch (" + ("bf16, " if gpu_spec.bf16 else "") + "adamw-fused: the HF Trainer's default)"
             ", the others named in its same_as"] if budgeted > len(remedies) else []
    if gpus * nodes == 1:
        notes.append(ONE_GPU_NOTE)
    decision = climb(base, evaluator)
    fix = None
    if decision.steps:  # the ladder's fix: row 1 of what is shown, whatever its speed (least disruptive, not fastest)
        fix = evaluate_remedy(decision.setup, host_ram_bytes, assumptions=assumptions, evaluator=evaluator)
        batch = decision.setup.batch  # launched as the ladder chose it: the margin holds at this micro-batch
        fix = replace(fix, name=fix.name + _ladder_suffix(base, decision),
                      config_files=files_for(Route.PROCESS_PER_GPU, decision.setup, batch, decision.accumulation)
                      if fix.fits and decision.setup.versions.framework == "transformers" else ())  # HF files only
    knobs = knob_table(base, host_ram_bytes, evaluator=evaluator)
    dm = next((r for r in remedies if r.route is Route.DEVICE_MAP and r.recommendable), None)
    dm = dm or next((r for r in remedies if r.route is Route.DEVICE_MAP), None)
    placement = None if dm is None or dm.setup is None else place_device_map(dm.setup)
    seq_note = (f"sequence searches stop at {spec.name}'s max_position_embeddings = {spec.max_position_embeddings} "
                f"(RoPE was trained to that length); micro-batch searches at {MAX_BATCH_SEARCH}")
    return Plan(model=spec.name, gpu=gpu_spec.name, gpus=gpus, nodes=nodes, seq=seq, host_ram_bytes=host_ram_bytes,
                configured=configured, remedies=tuple(remedies), dropped=tuple(dropped), knobs=knobs,
                device_map=placement, assumptions=tuple(describe_assumptions(gpu_spec, assumptions)) + (host.text,),
                seq_note=seq_note, lora_rank=lora_rank, host_ram_source=host.source, host_ram_assumed=host.assumed,
                speed_uncertainty=assumptions.speed_uncertainty, notes=tuple(notes), decision=decision, fix=fix)


def _ladder_suffix(base: TrainingSetup, decision: Decision) -> str:
    """What the fix changes that the remedy's name does not say: the micro-batch and accumulation, the length."""
    fix = decision.setup
    parts = []
    if fix.batch != base.batch:
        parts.append(f"micro-batch {fix.batch} × accumulation {decision.accumulation}")
    if fix.seq != base.seq:
        parts.append(f"seq {fix.seq}")
    if fix.gpus != base.gpus:
        parts.append(f"{fix.gpus} GPUs per node")
    if fix.loss is not base.loss:
        parts.append(f"loss {fix.loss.value}")
    parts += [pin_text(name, release) for name, release in fix.versions.given
              if (name, release) not in base.versions.given]  # an upgrade the fix needs (torchtune 0.2.0)
    return "".join(f" · {p}" for p in parts)


def plan_for(setup: TrainingSetup, host_ram: str | int | None = HOST_RAM_AUTO, *,
             assumptions: Assumptions = DEFAULT_ASSUMPTIONS, outside_bytes: int | None = None) -> Plan:
    """:func:`make_plan` of a typed setup: the user's run as read (``check``, the pipeline's setup record) is the
    plan's configured row, the ladder's start and the knob table's baseline."""
    s = setup
    return make_plan(s.model, s.gpu, s.gpus, s.nodes, host_ram, s.seq, batch=s.batch, precision=s.precision.value,
                     optimizer=s.optimizer.value, checkpointing=s.checkpointing, attention=s.attention.value,
                     lora_rank=s.lora_rank, strategy=s.strategy, method=s.method, lora_targets=s.lora_targets,
                     lora_alpha=s.lora_alpha, assumptions=assumptions, outside_bytes=outside_bytes,
                     trainer=s.trainer, reference=s.reference, versions=s.versions, loss=s.loss,
                     offload_activations=s.offload_activations, base_dtype=s.base_dtype,
                     optimizer_in_backward=s.optimizer_in_backward)


def distinct_top(plan: Plan, n: int = 3) -> tuple[Remedy, ...]:
    """The best recommendable remedy of each (route, strategy, method), best first, ``n`` of them."""
    seen, out = set(), []
    for r in plan.remedies:
        if r.recommendable and (r.route, r.strategy, r.method) not in seen and r.config_files:
            seen.add((r.route, r.strategy, r.method))
            out.append(r)
    return tuple(out[:n])
