"""The fix a maintainer would give: the least disruptive change that fits with a margin.

A ladder of rungs, in the order a maintainer tries them (issue 22): first what costs nothing (the fused AdamW, which
drops the foreach step's temporaries; Liger's fused linear cross-entropy, which never materialises the (tokens ×
vocab) logits: a dependency, the same loss), then activation checkpointing, then a smaller micro-batch with gradient
accumulation raised to keep the global batch, an 8-bit optimizer, more sharding on the same launcher, CPU offload --
and only then changes to *what is trained* (full → LoRA → QLoRA) or to *the data* (shorter sequences), each named as
such with its cost.  :func:`climb` applies the rungs one after another to the user's setup until the budget fits
with the setup class's margin (:mod:`.margin`), then drops every earlier change the fit does not need: the fix is
the first rung that fits, with only the changes it needs.

One decision procedure: ``check``, ``plan``, the pipeline and the explorer call :func:`climb` on the same typed
setup, so they give one verdict and one fix for one run.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from oomlab.budget.loss_kernels import LIGER_FAMILIES
from oomlab.budget.nf4_init import runs_torchao_unchunked
from oomlab.budget.trainers import PRECOMPUTABLE, resident_reference
from oomlab.core.choices import BaseDtype, Loss, Method, Optimizer, Reference, Strategy, Trainer
from oomlab.core.errors import InvalidValueError
from oomlab.core.setup import TORCHTUNE_CHUNKING, TrainingSetup, torchtune_strategies
from oomlab.core.units import format_size
from oomlab.remedies.margin import Margin, margin_for
from oomlab.remedies.remedy import Evaluation, Evaluator
from oomlab.remedies.throughput import speed_change

# What costs nothing but the budget cannot size: the caching allocator's fragmentation (part of the margin).
ALLOCATOR_ADVICE = ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (costs nothing: segments grow in place, so "
                    "fragmentation -- part of the margin -- shrinks; the budget itself does not count on it)")


class Kind(enum.Enum):
    """What a change costs the user, beyond memory."""

    FREE = "costs nothing"  # same training, same speed (or faster)
    SPEED = "costs speed"  # same training, slower steps
    HARDWARE = "costs hardware"  # same training on more GPUs of the same kind
    TRAINED = "changes what is trained"  # adapters instead of the model
    DATA = "changes the data"  # shorter sequences


class Rung(enum.Enum):
    """The ladder, least disruptive first (the order is the enum's)."""

    HALF_BASE = "the frozen base loaded in half"  # LoRA over a base from_pretrained loaded in fp32
    # torchtune 0.1 QLoRA: its pinned torchao 0.1 quantizes unchunked at init (oomlab.budget.nf4_init)
    CHUNKED_NF4 = "the torchtune release (0.2.0: chunked NF4)"
    FUSED_OPTIMIZER = "fused AdamW"
    PRECOMPUTE_REFERENCE = "precompute_ref_log_probs"  # DPO / KTO: no reference model during training
    FUSED_LOSS = "Liger's fused linear cross-entropy"  # SFT: the loss without the (tokens x vocab) logits
    CHECKPOINTING = "activation checkpointing"
    MICRO_BATCH = "smaller micro-batch, more accumulation"
    OPTIMIZER_8BIT = "8-bit AdamW"
    SHARDING = "more sharding"
    OFFLOAD = "CPU offload"
    MORE_GPUS = "more GPUs of the same kind"
    LORA = "LoRA"
    QLORA = "QLoRA"
    SHORTER_SEQ = "shorter sequences"


KIND = {Rung.HALF_BASE: Kind.FREE, Rung.CHUNKED_NF4: Kind.FREE, Rung.FUSED_OPTIMIZER: Kind.FREE,
        Rung.PRECOMPUTE_REFERENCE: Kind.SPEED, Rung.FUSED_LOSS: Kind.FREE,
        Rung.CHECKPOINTING: Kind.SPEED, Rung.MICRO_BATCH: Kind.SPEED,
        Rung.OPTIMIZER_8BIT: Kind.FREE, Rung.SHARDING: Kind.SPEED, Rung.OFFLOAD: Kind.SPEED,
        Rung.MORE_GPUS: Kind.HARDWARE,
        Rung.LORA: Kind.TRAINED, Rung.QLORA: Kind.TRAINED, Rung.SHORTER_SEQ: Kind.DATA}
COST = {
    Rung.HALF_BASE: "none: the same adapters, trained as fast or faster (autocast already computed every projection in "
                    "half); from_pretrained's torch_dtype in half makes the embedding, norms and residual stream half "
                    "too, as in any half-loaded LoRA run",
    Rung.CHUNKED_NF4: "an upgrade: torchtune 0.2.0 pins torchao 0.3.1, whose to_nf4 quantizes in chunks of "
                      "1024**2 elements, so the init no longer holds 64 bytes per element of a whole weight; the same "
                      "model, adapters and training (torchtune's other changes from 0.1 to 0.2 come with it)",
    Rung.FUSED_OPTIMIZER: "none: the same update in one kernel (the HF Trainer's default optim=adamw_torch_fused)",
    Rung.PRECOMPUTE_REFERENCE: "one extra pass over the data before training (the reference's log-probabilities "
                               "computed once and stored with the dataset); the same training after it",
    Rung.FUSED_LOSS: "liger-kernel as a dependency (Triton kernels, NVIDIA or AMD GPUs); the same loss, computed "
                     "over chunks of rows with the gradient in forward (use_liger_kernel=True)",
    Rung.CHECKPOINTING: "about a third more compute per step: each layer's forward runs again in backward",
    Rung.MICRO_BATCH: "the same global batch and results; smaller steps use the GPU less well",
    Rung.OPTIMIZER_8BIT: "bitsandbytes as a dependency; 8-bit moments train as well in published comparisons",
    Rung.SHARDING: "more communication per step (all-gathers of the sharded states)",
    Rung.OFFLOAD: "the optimizer states (and with ZeRO-3 the weights) cross PCIe every step: much slower",
    Rung.MORE_GPUS: "more GPUs to rent or buy; the sharded states spread thinner, the global batch kept by less "
                    "accumulation where there was some",
    Rung.LORA: "trains low-rank adapters, not the model",
    Rung.QLORA: "trains adapters over a 4-bit base: dequantization slows each step, the base loses precision",
    Rung.SHORTER_SEQ: "the data changes: sequences truncated, or split into shorter ones",
}

MAX_GPUS_PER_NODE_LADDER = 8  # the ladder doubles the GPUs of a node up to a common 8-GPU machine
# more sharding on the launcher the user already runs: DDP is sharded by accelerate's (or the Trainer's) FSDP
_MORE_SHARDING = {Strategy.DDP: Strategy.FSDP, Strategy.ZERO1: Strategy.ZERO2, Strategy.ZERO2: Strategy.ZERO3}
_OFFLOADED = {Strategy.SINGLE: Strategy.ZERO2_OFFLOAD, Strategy.DDP: Strategy.FSDP_OFFLOAD,
              Strategy.FSDP: Strategy.FSDP_OFFLOAD, Strategy.FSDP2: Strategy.FSDP2_OFFLOAD,
              Strategy.ZERO1: Strategy.ZERO2_OFFLOAD, Strategy.ZERO2: Strategy.ZERO2_OFFLOAD,
              Strategy.ZERO3: Strategy.ZERO3_OFFLOAD}


def rung_words(rung: Rung) -> str:
    """A ladder step in words: the rung, its kind and what it costs."""
    return f"{rung.value} ({KIND[rung].value}: {COST[rung]})"


@dataclass(frozen=True)
class Step:
    """One rung applied: the setup after it and the gradient accumulation that keeps the global batch."""

    rung: Rung
    setup: TrainingSetup
    accumulation: int  # gradient-accumulation steps (1: as the user had it, times what MICRO_BATCH raised)

    @property
    def words(self) -> str:
        return rung_words(self.rung)


@dataclass(frozen=True)
class Verdict:
    """The setup's budget against the GPU with the margin: fits, tight (inside the margin) or does not fit."""

    evaluation: Evaluation
    margin: Margin
    capacity_bytes: int
    loads: bool = True  # the launch gets the weights onto the GPUs (False: it fails before the first step)

    @property
    def needed_bytes(self) -> int:
        """The peak plus the margin: what must be free for a fit that survives the estimate's error."""
        return self.evaluation.per_gpu_peak_bytes + self.margin.bytes_for(self.evaluation.per_gpu_peak_bytes)

    @property
    def fits(self) -> bool:
        return self.loads and self.evaluation.fits and self.needed_bytes <= self.capacity_bytes

    @property
    def tight(self) -> bool:
        """Fits by the estimate, but inside the margin: "tight", never "fits"."""
        return self.loads and self.evaluation.fits and not self.fits

    @property
    def word(self) -> str:
        return "fits" if self.fits else "tight" if self.tight else "does not fit"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.word, "loads": self.loads, "per_gpu_peak_bytes": self.evaluation.per_gpu_peak_bytes,
                "margin_bytes": self.margin.bytes_for(self.evaluation.per_gpu_peak_bytes),
                "margin": self.margin.to_dict(), "capacity_bytes": self.capacity_bytes,
                "host_ram_bytes": self.evaluation.host_ram_bytes, "host_fits": self.evaluation.host_fits,
                "gpu_fits": self.evaluation.gpu_fits}

    def sentence(self) -> str:
        ev, cap = self.evaluation, self.capacity_bytes
        band = self.margin.bytes_for(ev.per_gpu_peak_bytes)
        text = (f"{self.word}: {format_size(ev.per_gpu_peak_bytes)} per GPU of {format_size(cap)}, margin "
                f"{format_size(band)} ({self.margin.words})")
        if not ev.host_fits:
            text += f"; host RAM: needs {format_size(ev.host_ram_bytes)}"
        if not self.loads:
            text += "; and it fails while loading, before the first step"
        return text


@dataclass(frozen=True)
class Decision:
    """The user's run, its verdict, and the least disruptive changes that fit (none: it fits as configured, or
    nothing on the ladder fits)."""

    configured: TrainingSetup
    verdict: Verdict  # of the configured run
    steps: tuple[Step, ...]  # the changes kept, ladder order; () when it fits as configured or nothing fits
    fixed: Verdict | None  # the verdict after the steps (None: nothing fits)
    tried: tuple[tuple[Rung, str], ...]  # each rung climbed and its verdict, in order
    tight: tuple[Step, ...] = ()  # the first rungs that fit by the estimate but inside the margin, when the fix is
    # further up the ladder (or nothing fits): the user may take that risk knowingly

    @property
    def setup(self) -> TrainingSetup | None:
        """The setup to launch (the configured one when it fits; None when nothing fits)."""
        if self.verdict.fits:
            return self.configured
        return self.steps[-1].setup if self.steps else None

    @property
    def accumulation(self) -> int:
        return self.steps[-1].accumulation if self.steps else 1

    @property
    def keeps_method(self) -> bool:
        return self.setup is not None and self.setup.method is self.configured.method

    def speeds(self) -> tuple[tuple[float, tuple[str, ...]], ...]:
        """Each kept step's modelled tokens/s over the setup before it, and the mechanisms that cost it
        (:func:`oomlab.remedies.throughput.speed_change`)."""
        setups = (self.configured, *(s.setup for s in self.steps))
        return tuple(speed_change(a, b) for a, b in zip(setups, setups[1:], strict=False))

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.to_dict(), "fixed": None if self.fixed is None else self.fixed.to_dict(),
                "steps": [{"rung": s.rung.value, "kind": KIND[s.rung].value, "cost": COST[s.rung],
                           "strategy": s.setup.strategy.value, "method": s.setup.method.value,
                           "optimizer": s.setup.optimizer.value, "checkpointing": s.setup.checkpointing,
                           "loss": s.setup.loss.value, "base_dtype": s.setup.base_dtype.value,
                           "batch": s.setup.batch, "seq": s.setup.seq, "accumulation": s.accumulation,
                           "speed_ratio": ratio, "slower_by": list(causes)}
                          for s, (ratio, causes) in zip(self.steps, self.speeds(), strict=True)],
                "tried": [{"rung": r.value, "verdict": v} for r, v in self.tried]}


def _apply(rung: Rung, step: Step, fits: Callable[[TrainingSetup], bool]) -> Step | None:
    """``rung`` applied to ``step``'s setup; None where it changes nothing (or cannot run there: under torchtune,
    Liger's loss and the strategies its recipes do not run)."""
    applied = _applied(rung, step, fits)
    if applied is not None and step.setup.versions.framework == "torchtune" \
            and (rung is Rung.FUSED_LOSS or applied.setup.strategy not in torchtune_strategies(applied.setup)
                 or applied.setup.optimizer is Optimizer.ADAMW_8BIT and applied.setup.strategy.fsdp):
        return None  # bitsandbytes' optimizers: single-device recipes only (pytorch/torchtune#1856)
    return applied


def _applied(rung: Rung, step: Step, fits: Callable[[TrainingSetup], bool]) -> Step | None:
    s = step.setup
    try:
        if rung is Rung.HALF_BASE:
            return Step(rung, s.with_(base_dtype=BaseDtype.HALF), step.accumulation) \
                if s.base_dtype is BaseDtype.FP32 and s.method is not Method.FULL else None
        if rung is Rung.CHUNKED_NF4:  # the first torchtune release whose pinned torchao chunks (its own pin dropped)
            return Step(rung, s.with_(versions=s.versions.with_given(torchtune=TORCHTUNE_CHUNKING, torchao=None)),
                        step.accumulation) if runs_torchao_unchunked(s) else None
        if rung is Rung.FUSED_OPTIMIZER:
            return Step(rung, s.with_(optimizer=Optimizer.ADAMW_FUSED), step.accumulation) \
                if s.optimizer in (Optimizer.ADAMW, Optimizer.ADAMW_HF) and not s.strategy.deepspeed else None
        if rung is Rung.PRECOMPUTE_REFERENCE:  # the trainer is kept: a DPO run's fix is still DPO
            return Step(rung, s.with_(reference=Reference.NONE), step.accumulation) \
                if s.trainer in PRECOMPUTABLE and resident_reference(s) else None
        if rung is Rung.FUSED_LOSS:  # kept only where the fit needs it (_minimal): where the logits weigh
            return Step(rung, s.with_(loss=Loss.LIGER_FLCE), step.accumulation) \
                if s.loss is Loss.STANDARD and s.trainer is Trainer.SFT and s.model.family in LIGER_FAMILIES else None
        if rung is Rung.CHECKPOINTING:
            return None if s.checkpointing else Step(rung, s.with_(checkpointing=True), step.accumulation)
        if rung is Rung.MICRO_BATCH:  # torchtune accumulates only without optimizer_in_bwd (its recipes raise)
            if s.batch == 1:
                return None
            base = s.with_(optimizer_in_backward=False) if s.optimizer_in_backward else s
            batch = next((b for b in _halvings(s.batch) if fits(base.with_(batch=b))), 1)
            return Step(rung, base.with_(batch=batch), step.accumulation * (s.batch // batch))
        if rung is Rung.OPTIMIZER_8BIT:
            return Step(rung, s.with_(optimizer=Optimizer.ADAMW_8BIT), step.accumulation) \
                if s.optimizer.adam and s.optimizer is not Optimizer.ADAMW_8BIT and not s.strategy.deepspeed else None
        if rung is Rung.SHARDING:
            more = _MORE_SHARDING.get(s.strategy)
            return None if more is None or s.world_size == 1 else Step(rung, s.with_(strategy=more), step.accumulation)
        if rung is Rung.OFFLOAD:
            off = _OFFLOADED.get(s.strategy)
            return None if off is None else Step(rung, s.with_(strategy=off), step.accumulation)
        if rung is Rung.MORE_GPUS:  # only sharded states shrink with more GPUs; a replica per GPU does not
            if not (s.strategy.fsdp or s.strategy.deepspeed) or s.gpus >= MAX_GPUS_PER_NODE_LADDER:
                return None
            counts = [n for n in (2, 4, 8) if s.gpus < n <= MAX_GPUS_PER_NODE_LADDER]
            gpus = next((n for n in counts if fits(s.with_(gpus=n))), counts[-1])  # the fewest that fit
            return Step(rung, s.with_(gpus=gpus), max(1, step.accumulation * s.gpus // gpus))
        if rung is Rung.LORA:  # adapters over a base loaded in half, as any LoRA launch should load it
            return Step(rung, s.with_(method=Method.LORA, base_dtype=BaseDtype.HALF), step.accumulation) \
                if s.method is Method.FULL else None
        if rung is Rung.QLORA:
            return Step(rung, s.with_(method=Method.QLORA, base_dtype=BaseDtype.HALF), step.accumulation) \
                if s.method is not Method.QLORA else None
        if rung is Rung.SHORTER_SEQ:
            seq = next((q for q in _halvings(s.seq) if q < s.seq and fits(s.with_(seq=q))), None)
            return None if seq is None else Step(rung, s.with_(seq=seq), step.accumulation)
    except InvalidValueError:
        return None  # the change cannot run here (QLoRA under ZeRO-3, offload of 4-bit weights, ...)
    raise AssertionError(rung)


def _halvings(n: int) -> Iterator[int]:
    """``n``, then halved down to 1: the values a maintainer would try."""
    while n > 1:
        n //= 2
        yield n


def climb(configured: TrainingSetup, evaluator: Evaluator,
          loads: Callable[[TrainingSetup], bool] | None = None) -> Decision:
    """The least disruptive fix of ``configured`` (see the module); ``loads`` says whether a setup's launch gets the
    weights onto the GPUs at all (``oomlab check`` walks the load path; None: the step decides)."""
    cache: dict[TrainingSetup, Verdict] = {}

    def verdict(s: TrainingSetup) -> Verdict:
        if s not in cache:
            cache[s] = Verdict(evaluator(s), margin_for(s), s.gpu.total_memory_bytes,
                               True if loads is None else loads(s))
        return cache[s]

    first = verdict(configured)
    if first.fits:
        return Decision(configured, first, (), first, ())
    applied: list[Step] = []
    current = Step(Rung.FUSED_OPTIMIZER, configured, 1)  # a seat for the configured setup; never kept
    tried = []
    tight: tuple[Step, ...] = ()
    for rung in Rung:
        step = _apply(rung, current, lambda s: verdict(s).fits)
        if step is None:
            continue
        v, before = verdict(step.setup), verdict(current.setup)
        tried.append((rung, v.word))
        if not v.fits and (v.evaluation.per_gpu_peak_bytes > before.evaluation.per_gpu_peak_bytes
                           or before.evaluation.host_fits and not v.evaluation.host_fits):
            continue  # it makes the GPU peak worse, or breaks the host RAM: not carried up the ladder
        applied.append(step)
        current = step
        if v.tight and not tight and not first.tight:
            tight = _minimal_tight(configured, applied, verdict)
        if v.fits:
            kept = _minimal(configured, applied, verdict)
            return Decision(configured, first, kept, verdict(kept[-1].setup), tuple(tried), tight)
    return Decision(configured, first, (), None, tuple(tried), tight)


def _minimal_tight(configured: TrainingSetup, applied: list[Step], verdict: Callable[[TrainingSetup], Verdict]
                   ) -> tuple[Step, ...]:
    """:func:`_minimal` for a fit by the estimate alone (inside the margin)."""
    def tight_or_fits(s: TrainingSetup) -> Verdict:
        v = verdict(s)
        return Verdict(v.evaluation, v.margin.without(), v.capacity_bytes, v.loads)
    return _minimal(configured, applied, tight_or_fits)


def _minimal(configured: TrainingSetup, applied: list[Step], verdict: Callable[[TrainingSetup], Verdict]
             ) -> tuple[Step, ...]:
    """Only the changes the fit needs: each earlier one dropped in turn (latest first) where the rest still fit
    with a micro-batch and a sequence no smaller (a searched rung must not pay for a dropped change: a shorter
    sequence instead of checkpointing is a worse fix, not a smaller one)."""
    kept = tuple(applied)
    for rung in reversed([s.rung for s in applied[:-1]]):
        trial = _replay(configured, [s.rung for s in kept if s.rung is not rung], verdict)
        if trial is None or not verdict(trial[-1].setup).fits:
            continue
        before, after = kept[-1].setup, trial[-1].setup
        if after.batch >= before.batch and after.seq >= before.seq:
            kept = trial
    return kept


def _replay(configured: TrainingSetup, rungs: list[Rung], verdict: Callable[[TrainingSetup], Verdict]
            ) -> tuple[Step, ...] | None:
    current = Step(Rung.FUSED_OPTIMIZER, configured, 1)
    out = []
    for rung in rungs:
        step = _apply(rung, current, lambda s: verdict(s).fits)
        if step is None:
            return None
        out.append(step)
        current = step
    return tuple(out)


