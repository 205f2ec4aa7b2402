"""One remedy: a configuration budgeted -- does it fit the GPUs and the host, what breaks it, how far it stretches
(largest micro-batch and sequence), how fast it would train, what it changes besides memory, what launches it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import BudgetResult, MemCategory
from oomlab.budget.states import weight_bytes_total
from oomlab.core.choices import BaseDtype, Method, Optimizer, Precision, Route, Strategy
from oomlab.core.search import largest_true
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import format_size
from oomlab.core.words import count
from oomlab.remedies.launch_files import files_for
from oomlab.remedies.peak_floor import Floor
from oomlab.remedies.placement import DeviceMapPlacement, place_device_map, replace_peak
from oomlab.remedies.throughput import DEFAULT_ASSUMPTIONS, Assumptions, StepTime, step_time

MAX_BATCH_SEARCH = 4096  # the micro-batch search stops here


def format_tokens_per_s(value: float | None) -> str:
    """Estimated tokens per second as every table and sentence shows them: ``12,345``; ``-`` when none."""
    return "-" if value is None else f"{value:,.0f}"


@dataclass(frozen=True)
class Caveat:
    """What a remedy changes besides memory."""

    text: str
    harmful: bool = False  # True: it makes the remedy a poor recommendation (pure half AdamW, plain SGD)


@dataclass(frozen=True)
class Remedy:
    """One configuration, budgeted: does it fit, what breaks it, how fast it would train."""

    name: str
    route: Route
    strategy: Strategy  # what each process holds (SINGLE on the device-map route)
    method: Method
    precision: Precision
    optimizer: Optimizer
    checkpointing: bool
    offload: str | None  # what lives on the host; None when nothing is offloaded
    fits: bool  # on the GPUs and in host RAM
    reason: str  # why it fits or not, or why it was dropped
    per_gpu_peak_bytes: int | None  # None when dropped
    headroom_bytes: int | None
    host_ram_bytes: int | None
    max_batch: int | None  # largest micro-batch that fits at the target length (None: not even 1)
    max_seq: int | None  # longest sequence at micro-batch 1 that fits, up to the model's context (None: none)
    tokens_per_s: float | None  # None when it does not fit
    config_files: tuple[str, ...] = ()  # files under outputs/configs/ that launch it
    breaking_component: MemCategory | None = None  # the largest component at the peak
    caveats: tuple[Caveat, ...] = ()  # what it changes besides memory
    dropped: bool = False  # the hardware or the libraries cannot run it
    gpu_fits: bool = False  # fits every GPU (host RAM aside)
    same_as: tuple[str, ...] = ()  # rows with the same figures that differ only in a label, folded into this one
    fails_at_load: bool = False  # moving the model to the GPUs fails, before the first step (the configured row)
    step: StepTime | None = field(default=None, compare=False)
    setup: TrainingSetup | None = field(default=None, repr=False, compare=False)

    framework: str = "transformers"  # the training code the versions name (torchtune, litgpt): its own launcher

    @property
    def recommendable(self) -> bool:
        """Fits and changes nothing that harms training (pure half AdamW, plain SGD)."""
        return self.fits and not any(c.harmful for c in self.caveats)

    def to_dict(self) -> dict[str, Any]:
        step = None if self.step is None else {
            "compute_s": self.step.compute_s, "collectives_s": self.step.collectives_s,
            "host_link_s": self.step.host_link_s, "host_optimizer_s": self.step.host_optimizer_s,
            "seconds": self.step.seconds, "tokens": self.step.tokens}
        return {"name": self.name, "route": self.route.value, "strategy": self.strategy.value,
                "method": self.method.value, "precision": self.precision.value, "optimizer": self.optimizer.value,
                "checkpointing": self.checkpointing, "offload": self.offload,
                "fits": self.fits, "reason": self.reason, "per_gpu_peak_bytes": self.per_gpu_peak_bytes,
                "headroom_bytes": self.headroom_bytes, "host_ram_bytes": self.host_ram_bytes,
                "max_batch": self.max_batch, "max_seq": self.max_seq, "tokens_per_s": self.tokens_per_s,
                "config_files": list(self.config_files),
                "breaking_component": None if self.breaking_component is None else self.breaking_component.value,
                "caveats": [{"text": c.text, "harmful": c.harmful} for c in self.caveats], "dropped": self.dropped,
                "gpu_fits": self.gpu_fits, "same_as": list(self.same_as), "fails_at_load": self.fails_at_load,
                "recommendable": self.recommendable, "step_time": step, "framework": self.framework}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Remedy:
        """The inverse of :meth:`to_dict`, without the setup and the step time (for display from results JSON)."""
        breaking = raw.get("breaking_component")
        return cls(
            name=raw["name"], route=Route(raw["route"]), strategy=Strategy(raw["strategy"]),
            method=Method(raw["method"]), precision=Precision(raw["precision"]),
            optimizer=Optimizer(raw["optimizer"]), checkpointing=bool(raw["checkpointing"]), offload=raw["offload"],
            fits=bool(raw["fits"]), reason=raw["reason"], per_gpu_peak_bytes=raw["per_gpu_peak_bytes"],
            headroom_bytes=raw["headroom_bytes"], host_ram_bytes=raw["host_ram_bytes"], max_batch=raw["max_batch"],
            max_seq=raw["max_seq"], tokens_per_s=raw["tokens_per_s"], config_files=tuple(raw["config_files"]),
            breaking_component=None if breaking is None else MemCategory(breaking),
            caveats=tuple(Caveat(c["text"], bool(c["harmful"])) for c in raw["caveats"]), dropped=bool(raw["dropped"]),
            gpu_fits=bool(raw.get("gpu_fits", raw["fits"])), same_as=tuple(raw.get("same_as", ())),
            fails_at_load=bool(raw.get("fails_at_load", False)), framework=str(raw.get("framework", "transformers")),
        )


_STRATEGY_NAMES = {Strategy.SINGLE: "one GPU", Strategy.DDP: "DDP", Strategy.ZERO1: "DeepSpeed ZeRO-1",
                   Strategy.ZERO2: "DeepSpeed ZeRO-2", Strategy.ZERO3: "DeepSpeed ZeRO-3",
                   Strategy.ZERO2_OFFLOAD: "DeepSpeed ZeRO-2 + CPU optimizer offload",
                   Strategy.ZERO3_OFFLOAD: "DeepSpeed ZeRO-3 + CPU offload", Strategy.FSDP: "FSDP1 full shard",
                   Strategy.FSDP_OFFLOAD: "FSDP1 full shard + CPU offload",
                   Strategy.FSDP2: "FSDP2 fully_shard", Strategy.FSDP2_OFFLOAD: "FSDP2 fully_shard + CPU offload"}

_LAUNCHERS = {
    Strategy.SINGLE: "accelerate launch --num_processes 1 (or python / the HF Trainer on one GPU)",
    Strategy.DDP: "accelerate launch, distributed_type MULTI_GPU (DDP; torchrun + the HF Trainer likewise)",
    Strategy.FSDP: "accelerate launch, distributed_type FSDP, fsdp_version 1 (accelerate's default)",
    Strategy.FSDP_OFFLOAD: "accelerate launch, FSDP fsdp_version 1, fsdp_offload_params true",
    Strategy.FSDP2: "accelerate launch, FSDP fsdp_version 2 (the HF Trainer's default with --fsdp)",
    Strategy.FSDP2_OFFLOAD: "accelerate launch, FSDP fsdp_version 2, fsdp_offload_params true",
    Strategy.ZERO1: "accelerate launch, distributed_type DEEPSPEED, a ZeRO stage 1 JSON (or the deepspeed launcher)",
    Strategy.ZERO2: "accelerate launch, distributed_type DEEPSPEED, a ZeRO stage 2 JSON (or the deepspeed launcher)",
    Strategy.ZERO3: "accelerate launch, distributed_type DEEPSPEED, a ZeRO stage 3 JSON, zero3_init_flag (zero.Init "
                    "while loading)",
    Strategy.ZERO2_OFFLOAD: "accelerate launch, DEEPSPEED, ZeRO stage 2 JSON with offload_optimizer device cpu",
    Strategy.ZERO3_OFFLOAD: "accelerate launch, DEEPSPEED, ZeRO stage 3 JSON with offload_optimizer and offload_param "
                            "device cpu, zero3_init_flag",
}


# torchtune's and litgpt's own launchers (where the versions name the framework): their recipes and scripts take the
# setup as config overrides; what they cannot launch (DeepSpeed, a DDP replica, accelerate's device_map) says so
_FRAMEWORK_LAUNCHERS = {
    ("torchtune", Strategy.SINGLE): "tune run with a *_single_device recipe (the setup as key=value config overrides)",
    ("torchtune", Strategy.FSDP): "tune run --nproc_per_node N with a *_distributed recipe (torchtune shards with "
                                  "FSDP)",
    ("torchtune", Strategy.FSDP2): "tune run --nproc_per_node N with a *_distributed recipe (torchtune shards with "
                                   "FSDP2)",
    ("torchtune", Strategy.FSDP2_OFFLOAD): "tune run --nproc_per_node N with a *_distributed recipe and "
                                           "fsdp_cpu_offload=True",
    ("litgpt", Strategy.SINGLE): "litgpt finetune / finetune_lora with --devices 1 (Lightning Fabric)",
    ("litgpt", Strategy.FSDP): "litgpt finetune / finetune_lora with --devices N (Fabric's FSDP strategy)",
}


def launcher(route: Route, strategy: Strategy, framework: str = "transformers") -> str:
    """The launch a remedy stands for: the command and the distributed configuration that run it -- torchtune's or
    litgpt's own where the versions name that ``framework`` (a launch it has not: the HF one, said so)."""
    if framework != "transformers":
        own = _FRAMEWORK_LAUNCHERS.get((framework, strategy)) if route is not Route.DEVICE_MAP else None
        if own is not None:
            return own
        return f"{launcher(route, strategy)} -- not a {framework} launch: {framework} has no such one"
    if route is Route.DEVICE_MAP:
        return "python, from_pretrained(device_map='auto'): one process over every GPU"
    return _LAUNCHERS[strategy]


def remedy_name(route: Route, strategy: Strategy, method: Method, precision: Precision, optimizer: Optimizer,
                checkpointing: bool, lora_rank: int, base_dtype: BaseDtype = BaseDtype.HALF) -> str:
    """A readable name: ``FSDP full shard · LoRA r8 · fp16-mixed · adamw · checkpointing`` (``LoRA r8 over an fp32
    base`` where the frozen base stays as loaded in fp32)."""
    s = "device_map='auto'" if route is Route.DEVICE_MAP else _STRATEGY_NAMES[strategy]
    m = {Method.FULL: "full fine-tuning", Method.LORA: f"LoRA r{lora_rank}", Method.QLORA: f"QLoRA r{lora_rank}"}
    over = " over an fp32 base" if base_dtype is BaseDtype.FP32 and method is not Method.FULL else ""
    parts = [s, m[method] + over, precision.value, optimizer.value] + (["checkpointing"] if checkpointing else [])
    return " · ".join(parts)


def caveats(setup: TrainingSetup) -> tuple[Caveat, ...]:
    """What a remedy changes besides memory; the harmful ones make it a poor recommendation.

    Each text is a verb phrase whose subject is the remedy ("It trains ...; it keeps ..."): the plan's text joins them.
    """
    out = []
    if setup.method is Method.LORA:
        out.append(Caveat("trains low-rank adapters, not every weight (Hu et al. 2021)"))
    if setup.method is Method.QLORA:
        out.append(Caveat("trains adapters over a 4-bit NF4 base (Dettmers et al. 2023)"))
    if setup.precision in (Precision.FP16, Precision.BF16):  # torchtune's recipes have no mixed precision: its way
        out.append(Caveat("runs pure half precision, no fp32 master weights: small updates vanish "
                          "(Micikevicius et al. 2018)", harmful=setup.versions.framework != "torchtune"))
    if setup.optimizer is Optimizer.SGD:
        out.append(Caveat("uses SGD with momentum instead of AdamW: different, usually worse, LLM fine-tuning",
                          harmful=True))
    if setup.optimizer is Optimizer.ADAMW_8BIT:
        out.append(Caveat("keeps 8-bit optimizer states (Dettmers et al. 2022)"))
    if setup.checkpointing:
        out.append(Caveat("recomputes each layer's forward in backward"))
    if setup.strategy.deepspeed:
        out.append(Caveat("casts every weight to half and keeps an fp32 master partition (DeepSpeed; no autocast)"))
    if setup.strategy.offloads_optimizer and setup.strategy.deepspeed:
        out.append(Caveat("runs the optimizer step on the host CPU (DeepSpeedCPUAdam): bound by host memory "
                          "bandwidth and the PCIe link"))
    return tuple(out)


def offload_of(route: Route, strategy: Strategy) -> str | None:
    """What the remedy keeps on the host, or None."""
    if route is not Route.PROCESS_PER_GPU:
        return None
    if strategy is Strategy.ZERO2_OFFLOAD:
        return "cpu: fp32 master, fp32 gradients, optimizer state and step (DeepSpeedCPUAdam)"
    if strategy is Strategy.ZERO3_OFFLOAD:
        return "cpu: parameter partitions, gradients, fp32 master, optimizer state and step (DeepSpeedCPUAdam)"
    if strategy.offloads:
        return "cpu: parameters, gradients, optimizer state"
    return None


@dataclass(frozen=True)
class Evaluation:
    """One setup on one route, budgeted against the GPUs and the host RAM."""

    per_gpu_peak_bytes: int
    headroom_bytes: int
    host_ram_bytes: int
    breaking: MemCategory
    gpu_fits: bool
    host_fits: bool
    result: BudgetResult
    placement: DeviceMapPlacement | None = None

    @property
    def fits(self) -> bool:
        return self.gpu_fits and self.host_fits


class Evaluator:
    """Budgets setups (analytic), device_map placements fixed per remedy, with the host RAM limit."""

    def __init__(self, host_ram_bytes: int, outside_bytes: int | None) -> None:
        self.host_ram_bytes = host_ram_bytes
        self.outside_bytes = outside_bytes

    def __call__(self, setup: TrainingSetup, placement: DeviceMapPlacement | None = None,
                 route: Route = Route.PROCESS_PER_GPU) -> Evaluation:
        if route is Route.DEVICE_MAP:
            single = replace(setup, strategy=Strategy.SINGLE)
            result = estimate_setup(single, self.outside_bytes)
            if placement is None:
                placement = place_device_map(setup, result)
                peak = placement.per_gpu_peak_bytes
            else:
                peak = replace_peak(placement, result)
            host = weight_bytes_total(setup)  # NB: one process loads the model once
            cap = setup.gpu.total_memory_bytes
            gpu_fits = peak <= cap and not placement.spilled
            return Evaluation(peak, cap - peak, host, result.breaking_component, gpu_fits,
                              host <= self.host_ram_bytes, result, placement)
        result = estimate_setup(setup, self.outside_bytes)
        return Evaluation(result.per_gpu_peak_bytes, result.headroom_bytes, result.host_ram_bytes,
                          result.breaking_component, result.fits, result.host_ram_bytes <= self.host_ram_bytes,
                          result)

    def cannot_fit(self, setup: TrainingSetup, route: Route, batch: int | None = None) -> Floor | None:
        """A floor of ``setup``'s budget (at micro-batch ``batch``) that shows it cannot fit, else None: this evaluator
        knows none (the hardware search's does, :mod:`oomlab.remedies.peak_floor`)."""
        return None


def reason(ev: Evaluation, setup: TrainingSetup, host_ram_bytes: int) -> str:
    """Why the evaluation fits or not, in one line."""
    cap = setup.gpu.total_memory_bytes
    parts = []
    if ev.gpu_fits:
        parts.append(f"fits: {format_size(ev.per_gpu_peak_bytes)} per GPU of {format_size(cap)}, "
                     f"headroom {format_size(ev.headroom_bytes)}")
    elif ev.placement is not None and ev.placement.spilled == ("",):  # accelerate's map of one entry: the root
        parts.append("device_map puts the whole model on the CPU: no decoder layer fits a GPU beside the step's "
                     "other memory (accelerate's offload hooks cannot train it)")
    elif ev.placement is not None and ev.placement.spilled:
        parts.append(f"device_map spills {count(len(ev.placement.spilled), 'module')} to the CPU "
                     f"(accelerate's offload hooks cannot train them)")
    else:
        comp = ev.result.components
        largest = max(comp, key=lambda k: comp[k])
        parts.append(f"GPU: needs {format_size(ev.per_gpu_peak_bytes)} of {format_size(cap)} "
                     f"(short by {format_size(-ev.headroom_bytes)}); largest: {largest.value} "
                     f"{format_size(comp[largest])} in the {ev.result.peak_phase.value} phase"
                     + (f"; loading peaks above the step ({format_size(ev.result.load.need_bytes)})"
                        if ev.result.loading_peaks else ""))
    if not ev.host_fits:
        parts.append(f"host RAM: needs {format_size(ev.host_ram_bytes)} of {format_size(host_ram_bytes)}")
    return "; ".join(parts)


def evaluate_remedy(setup: TrainingSetup, host_ram_bytes: int, *, route: Route = Route.PROCESS_PER_GPU,
                    assumptions: Assumptions = DEFAULT_ASSUMPTIONS, outside_bytes: int | None = None,
                    evaluator: Evaluator | None = None, search_seq: bool = True) -> Remedy:
    """Budget ``setup`` on ``route``, search its limits and estimate its throughput (``search_seq`` False: no
    longest-sequence search, ``max_seq`` None -- the hardware search shows no length)."""
    ev_fn = evaluator or Evaluator(host_ram_bytes, outside_bytes)
    ev = ev_fn(setup, route=route)
    placement = ev.placement

    def fits_batch(b: int) -> bool:
        return ev_fn.cannot_fit(setup, route, b) is None and ev_fn(replace(setup, batch=b), placement, route).fits

    def fits_seq(s: int) -> bool:
        return ev_fn(replace(setup, batch=1, seq=s), placement, route).fits

    max_batch = largest_true(fits_batch, 1, MAX_BATCH_SEARCH)
    max_seq = largest_true(fits_seq, 1, setup.model.max_position_embeddings) if search_seq else None
    tps, step = None, None
    if ev.fits:
        b = min(max_batch or setup.batch, assumptions.throughput_batch_cap)
        step = step_time(setup, assumptions, route, batch=b)
        tps = step.tokens_per_s
    return Remedy(
        name=remedy_name(route, setup.strategy, setup.method, setup.precision, setup.optimizer, setup.checkpointing,
                         setup.lora_rank, setup.base_dtype),
        route=route, strategy=setup.strategy, method=setup.method, precision=setup.precision,
        optimizer=setup.optimizer, checkpointing=setup.checkpointing, offload=offload_of(route, setup.strategy),
        fits=ev.fits, reason=reason(ev, setup, host_ram_bytes), per_gpu_peak_bytes=ev.per_gpu_peak_bytes,
        headroom_bytes=ev.headroom_bytes, host_ram_bytes=ev.host_ram_bytes, max_batch=max_batch, max_seq=max_seq,
        tokens_per_s=tps, breaking_component=ev.breaking, caveats=caveats(setup), gpu_fits=ev.gpu_fits, step=step,
        config_files=files_for(route, setup, max_batch) if ev.fits and setup.versions.framework == "transformers"
        else (),  # oomlab's launch files are a transformers + peft kit
        setup=setup, framework=setup.versions.framework,
    )


def dropped_remedy(route: Route, strategy: Strategy, method: Method, precision: Precision, optimizer: Optimizer,
                   checkpointing: bool, lora_rank: int, why: str) -> Remedy:
    """A configuration the hardware or the libraries cannot run, with the reason."""
    return Remedy(name=remedy_name(route, strategy, method, precision, optimizer, checkpointing, lora_rank),
                  route=route, strategy=strategy, method=method, precision=precision, optimizer=optimizer,
                  checkpointing=checkpointing, offload=offload_of(route, strategy), fits=False, reason=why,
                  per_gpu_peak_bytes=None, headroom_bytes=None, host_ram_bytes=None, max_batch=None, max_seq=None,
                  tokens_per_s=None, dropped=True)
