"""The memory of preference and RL trainers: what a DPO, ORPO, KTO, GRPO, PPO or reward-modelling step holds beside
the SFT step of :mod:`.inventory` -- the policy's step over the sequences its forward carries, a frozen reference
model, the reward and value models, generation's KV cache -- each term with the TRL source line it comes from.

Read against TRL 1.16.0 (``pip install trl==1.16.0``; PPO was removed from TRL 1.x, read at 0.29).  NB: TRL's
configs default to ``bf16=True`` (``trl/trainer/base_config.py`` :108): a TRL run is ``bf16-mixed`` unless it says.

- **DPO** (``trl/trainer/dpo_trainer.py``): chosen and rejected are one batch, ``torch.cat`` of the two
  (``_collate`` :349-352), so the policy's forward carries ``2 × batch`` sequences; the loss runs the model with
  ``fused_lm_head=True`` (:1299), TRL's chunked log-prob head (``trl/trainer/utils.py`` ``add_fused_lm_head``,
  ``trl/kernels/chunked_logprob.py`` ``ChunkedLogProbFunction``): no ``(tokens × vocab)`` logits, a
  ``min(tokens, 4096) × 32768`` buffer instead, whatever the vocabulary (:func:`fused_head_tensors`).  The reference:
  none with a peft model (``use_adapter(model,
  None)`` disables the adapters: the base serves, :1328-1336) or with ``precompute_ref_log_probs`` (:909-914), else
  ``create_model_from_path(..., dtype=self.model.dtype)`` (:915-927: a second copy in the policy's dtype as loaded),
  prepared by ``prepare_deepspeed`` / ``prepare_fsdp`` / ``prepare_model(evaluation_mode=True)`` (:984-990): no
  gradients, no optimizer state.  Its forward runs after the policy's, under ``torch.no_grad()`` (:1327).
- **KTO** (``trl/trainer/kto_trainer.py``): unpaired, ``batch`` sequences with gradients (:1397; its KL batch runs
  under ``no_grad``, :1364-1365), the same reference rule (:920-925), the fused head.
- **ORPO** (``trl/experimental/orpo/orpo_trainer.py`` ``concatenated_forward`` :745, ``all_logits`` :777): no
  reference, chosen and rejected concatenated, the logits materialised as transformers' loss has them.
- **GRPO** (``trl/trainer/grpo_trainer.py``, ``grpo_config.py``): ``beta`` defaults to ``0.0`` (:681-687) and then
  no reference model is loaded (:984-986); ``per_device_train_batch_size`` counts completions; generation
  (``unwrapped_model.generate`` :1873, ``torch.no_grad``) holds the KV cache of every completion at full length
  (``num_generations`` completions of ``max_completion_length``: the setup's ``batch`` × ``seq``) and, under ZeRO-3,
  the gathered parameters (``ds3_gather_for_generation=True``); the fused head for the loss.
- **PPO** (TRL 0.29 ``trl/trainer/ppo_trainer.py``, class ``PolicyAndValueWrapper``): the policy and a value model
  trained together (one optimizer), a frozen reference and a frozen reward model, generation as GRPO's.  The value
  and reward models are taken to be the policy's architecture (NB: the LM head counted for them).
- **reward modelling** (``trl/trainer/reward_trainer.py``): chosen and rejected concatenated (``2 × batch``) through
  an ``AutoModelForSequenceClassification``: a one-wide score, no vocabulary logits (NB: the LM head's weights are
  still counted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

from oomlab.budget import activations as act
from oomlab.budget import states
from oomlab.budget.analytic import ALLOCATOR_FRAGMENTATION, host_ram_bytes, sft_estimate
from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.inventory import assemble_phases, take_inventory
from oomlab.budget.result import BudgetResult, MemCategory, Phase
from oomlab.budget.step_parts import Inventory, StepTensors
from oomlab.core.choices import Method, Precision, Reference, Strategy, Trainer
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import MiB, format_size

TRL_VERSION = "1.16.0"  # the TRL whose source these terms are read from (PPO: 0.29, removed from 1.x)
TOKEN_TILE = 4096  # trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE: tokens per projection tile
VOCAB_TILE = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: vocabulary columns per tile
# ChunkedLogProbFunction.forward's fp32 per-token vectors: running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum,
# max_before_target, target_logit, then log_z and the log-probabilities
FUSED_VECTORS = 9
FUSED_TRAINERS = frozenset({Trainer.DPO, Trainer.KTO, Trainer.GRPO})  # model(..., fused_lm_head=True) in TRL 1.16
REFERENCE_BY_DEFAULT = frozenset({Trainer.DPO, Trainer.KTO, Trainer.PPO})  # GRPO: beta=0.0 loads none
# the trainers whose config has precompute_ref_log_probs (DPOConfig, KTOConfig): the reference runs once over the data
PRECOMPUTABLE = frozenset({Trainer.DPO, Trainer.KTO})


@dataclass(frozen=True)
class TrainerTerms:
    """Per-GPU bytes one trainer adds to (or changes in) the SFT step of its policy, each said in :attr:`lines`."""

    trainer: Trainer
    sequences: int  # sequences the policy's forward carries with gradients (per GPU)
    reference: int  # the frozen reference model's weights (0: none resident)
    reward: int  # PPO: the frozen reward model's weights
    value: int  # PPO: the trained value model's weights (and master weights) and optimizer state, held all step
    value_gradients: int  # PPO: the value model's gradients (backward's end, the optimizer step)
    kv_cache: int  # generation: every completion's keys and values at full length
    generation: int  # generation: the last position's logits (half and the fp32 copy) and ZeRO-3's gathered weights
    fused_head: bool  # TRL's chunked log-prob head replaces the logits
    lines: tuple[str, ...]  # each term in words, with its source

    @property
    def resident(self) -> int:
        """Bytes held all step beside the policy's states: the frozen models and the value model."""
        return self.reference + self.reward + self.value


def resident_reference(setup: TrainingSetup) -> bool:
    """Does a second, frozen copy of the model sit in GPU memory (not peft's adapter-disabled base)?"""
    wanted = setup.reference is Reference.RESIDENT or (
        setup.reference is Reference.DEFAULT and setup.trainer in REFERENCE_BY_DEFAULT)
    return wanted and setup.method is Method.FULL


def runs_reference(setup: TrainingSetup) -> bool:
    """Does each step run a reference forward (a resident copy, or peft's adapter-disabled base)?"""
    return setup.reference is Reference.RESIDENT or (
        setup.reference is Reference.DEFAULT and setup.trainer in REFERENCE_BY_DEFAULT)


def sequences(setup: TrainingSetup) -> int:
    """Sequences the policy's forward carries with gradients: chosen and rejected concatenated for the pairwise
    trainers (DPO ``_collate`` :349-352, ORPO ``concatenated_forward``, reward modelling), else the micro-batch."""
    return 2 * setup.batch if setup.trainer.preference else setup.batch


def policy_setup(setup: TrainingSetup) -> TrainingSetup:
    """The SFT step the trainer's policy runs: the setup over :func:`sequences` sequences."""
    return replace(setup, batch=sequences(setup), trainer=Trainer.SFT, reference=Reference.DEFAULT)


def frozen_copy_bytes(setup: TrainingSetup) -> int:
    """Per-GPU bytes of a frozen full copy of the model as TRL prepares it: loaded in the policy's dtype (DPO
    :924 ``dtype=self.model.dtype``); DeepSpeed's ``prepare_deepspeed`` runs it at stage 0 below ZeRO-3 (a half
    replica, ``trl/models/utils.py`` :284-286) and partitions it under ZeRO-3; ``prepare_fsdp`` shards it."""
    n = setup.model.num_parameters
    if setup.strategy.deepspeed:
        half = 4 if setup.precision is Precision.FP32 else 2
        return half * n // (setup.world_size if setup.strategy.zero_stage == 3 else 1)
    replica = states.param_bytes(setup) * n
    return replica // setup.world_size if setup.strategy.fsdp else replica


def kv_cache_bytes(setup: TrainingSetup) -> int:
    """Keys and values of every layer for ``batch`` sequences of ``seq`` positions, in the compute dtype
    (transformers' ``DynamicCache`` at the end of ``generate``)."""
    spec = setup.model
    half = 4 if setup.precision is Precision.FP32 else 2
    return 2 * spec.num_hidden_layers * setup.batch * setup.seq * spec.num_key_value_heads * spec.head_dim * half


def trainer_terms(setup: TrainingSetup) -> TrainerTerms:
    """The setup's :class:`TrainerTerms`."""
    t = setup.trainer
    lines: list[str] = [f"trainer: {t.value} as TRL {TRL_VERSION} runs it" if t is not Trainer.PPO
                        else "trainer: ppo as TRL 0.29 ran it (removed from TRL 1.x)"]
    seqs = sequences(setup)
    if seqs != setup.batch:
        lines.append(f"chosen and rejected concatenated: the policy's forward carries 2 × {setup.batch} = {seqs} "
                     "sequences (activations and the loss for each)")
    reference = frozen_copy_bytes(setup) if resident_reference(setup) else 0
    if reference:
        lines.append(f"reference model: {format_size(reference)}, a frozen copy in the policy's dtype, no gradients "
                     "or optimizer state (dpo_trainer.py :915-927)")
    elif runs_reference(setup):
        lines.append("reference model: peft's adapter-disabled base serves, no second copy (dpo_trainer.py "
                     ":1328-1336)")
    elif t is Trainer.GRPO:
        lines.append("reference model: none (beta=0.0, GRPOConfig's default: grpo_trainer.py :984-986)")
    elif t in REFERENCE_BY_DEFAULT or setup.reference is Reference.NONE:
        lines.append("reference model: none resident (precompute_ref_log_probs: one extra pass over the data before "
                     "training computes the reference log-probabilities)")
    reward = value = value_gradients = 0
    if t is Trainer.PPO:
        reward = frozen_copy_bytes(setup)
        s = take_inventory(setup).states
        value, value_gradients = s.persistent, s.gradients
        lines.append(f"reward model: {format_size(reward)} frozen; value model: {format_size(value + value_gradients)} "
                     "trained (weights, optimizer state, gradients), both the policy's architecture (ppo_trainer.py "
                     "PolicyAndValueWrapper)")
    kv = gen = 0
    if t.generates:
        kv = kv_cache_bytes(setup)
        half = 4 if setup.precision is Precision.FP32 else 2
        gen = setup.batch * setup.model.vocab_size * (half + 4)  # generate: logits[:, -1] and its fp32 copy
        if setup.strategy.zero_stage == 3:  # ds3_gather_for_generation=True: every parameter gathered
            gen += frozen_copy_bytes(replace(setup, strategy=Strategy.ZERO2))
        lines.append(f"generation: KV cache {format_size(kv)} for {setup.batch} completions × {setup.seq} positions "
                     f"(prompt + max_completion_length), {format_size(gen)} of last-token logits"
                     + (" and ZeRO-3's gathered weights" if setup.strategy.zero_stage == 3 else "")
                     + ("; NB: GRPO generates steps_per_generation (default: gradient_accumulation_steps) "
                        "micro-batches at once (grpo_config.py :1098-1100): budgeted for one" if t is Trainer.GRPO
                        else ""))
    fused = t in FUSED_TRAINERS
    if fused:
        lines.append(f"loss: TRL's fused LM head ({TOKEN_TILE} × {VOCAB_TILE} tiles), no (tokens × vocab) logits")
    return TrainerTerms(t, seqs, reference, reward, value, value_gradients, kv, gen, fused, tuple(lines))


def fused_head_tensors(policy: TrainingSetup, t: StepTensors) -> StepTensors:
    """The policy's step tensors with transformers' loss replaced by TRL's ``ChunkedLogProbFunction``.

    Forward: a ``min(N, 4096) × 32768`` tile in the compute dtype (``mm_buf``), the hidden chunk and weight
    slice cast to it, and nine fp32 per-token vectors; saved: the hidden states (``last_hidden_state[:, :-1]``
    reshaped: a copy, in the stream's dtype; it replaces the lm_head input transformers' head saves) and ``log_z``.
    Backward: ``grad_hidden`` (fp32, ``N × H``), ``grad_weight`` (fp32, ``V × H``, when the head is trained), the
    tile again.  ``StepTensors.loss_backward`` counts ``2 × loss_grad`` (transformers' two logits gradients): the
    fused backward's transients are split evenly between them.
    """
    spec = policy.model
    n, h, v = act.tokens(policy), spec.hidden_size, spec.vocab_size
    compute = 4 if policy.precision is Precision.FP32 else 2
    hidden = act.stream_bytes(policy)
    # mm_buf is allocated (min(N, 4096), chunk_size) whatever the vocabulary (chunked_logprob.py :347, :413): a
    # vocabulary under 32768 columns fills part of it
    rows, cols = min(n, TOKEN_TILE), VOCAB_TILE
    casts = (rows * h * compute if hidden != compute else 0) \
        + (min(v, cols) * h * compute if states.param_bytes(policy) != compute else 0)
    forward = rows * cols * compute + casts + FUSED_VECTORS * 4 * n
    full = policy.method is Method.FULL
    head_input = n * h * (4 if policy.precision is Precision.FP32 else 2) if full else 0  # in layer_activations
    saved = n * h * hidden + 4 * n
    backward = 4 * n * h + (4 * v * h if full else 0) + rows * cols * compute + casts + 4 * n
    return replace(t, layer_activations=t.layer_activations - head_input, logits=forward, logits_fp32=0,
                   log_softmax=saved, loss_grad=-(-backward // 2))


def score_head_tensors(t: StepTensors) -> StepTensors:
    """Reward modelling: a one-wide score per sequence, no vocabulary logits (the loss tensors are bytes)."""
    return replace(t, logits=0, logits_fp32=0, log_softmax=0, loss_grad=0)


def _add(phase: dict[MemCategory, int], **extra: int) -> dict[MemCategory, int]:
    out = dict(phase)
    for name, value in extra.items():
        if value:
            key = MemCategory[name]
            out[key] = out.get(key, 0) + value
    return out


def trainer_phases(setup: TrainingSetup, inventory: Inventory, terms: TrainerTerms
                   ) -> dict[Phase, dict[MemCategory, int]]:
    """The policy's phases (``inventory`` is the policy's, its loss tensors already the trainer's) with the
    trainer's terms: the frozen models (and the value model's states) in every phase; the reference forward
    (after the policy's, under no_grad: its hidden states and, under autocast, its cast weights) and generation
    (KV cache and last-token logits, before the policy's forward, nothing saved yet) as forward candidates."""
    policy = policy_setup(setup)
    phases = assemble_phases(policy, inventory)
    s, t = inventory.states, inventory.tensors
    frozen = terms.reference + terms.reward
    value_states = terms.value  # NB: the value model's weights, master weights and optimizer state, as one figure
    out = {p: _add(c, WEIGHTS=frozen, OPTIMIZER_STATE=value_states) for p, c in phases.items()}
    if terms.trainer is Trainer.PPO:  # the value model's saved activations and gradients beside the policy's
        for p in (Phase.FORWARD, Phase.BACKWARD):
            if out[p].get(MemCategory.ACTIVATIONS):
                out[p] = _add(out[p], ACTIVATIONS=t.layer_activations)
        for p in (Phase.BACKWARD, Phase.OPTIMIZER):
            if out[p].get(MemCategory.GRADIENTS):
                out[p] = _add(out[p], GRADIENTS=terms.value_gradients)
    forward = [out[Phase.FORWARD]]
    if runs_reference(setup):
        n = act.tokens(policy) * policy.model.hidden_size * act.stream_bytes(policy)
        cast = t.autocast_cache if terms.reference else 0  # the reference's own autocast cache, held to its end
        forward.append(_add({k: v for k, v in out[Phase.FORWARD].items() if k is not MemCategory.LOGITS_LOSS},
                            LOGITS_LOSS=t.log_softmax + 2 * n + t.logits, WORKSPACE=cast))
    if terms.kv_cache:
        held = {MemCategory.WEIGHTS: s.weights + frozen, MemCategory.MASTER_WEIGHTS: s.master_weights,
                MemCategory.OPTIMIZER_STATE: s.optimizer_state + s.held_gradients + value_states}
        forward.append(_add(held, WORKSPACE=terms.kv_cache + terms.generation))
    out[Phase.FORWARD] = max(forward, key=lambda d: sum(d.values()))
    return out


def trainer_estimate(setup: TrainingSetup, outside_bytes: int | None = None,
                     deepspeed: DeepSpeedSettings | None = None) -> BudgetResult:
    """The analytic budget of ``setup`` under its trainer (SFT: :func:`~oomlab.budget.analytic.sft_estimate`'s)."""
    if setup.trainer is Trainer.SFT:
        return sft_estimate(setup, outside_bytes, deepspeed)
    policy = policy_setup(setup)
    base = sft_estimate(policy, outside_bytes, deepspeed)  # the policy's notes, outside PyTorch, capacity
    terms = trainer_terms(setup)
    inventory = take_inventory(policy, deepspeed)
    if terms.fused_head:
        inventory = replace(inventory, tensors=fused_head_tensors(policy, inventory.tensors))
    elif setup.trainer is Trainer.REWARD:
        inventory = replace(inventory, tensors=score_head_tensors(inventory.tensors))
    phases = trainer_phases(setup, inventory, terms)
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    at_peak = {k: v for k, v in phases[peak_phase].items() if v}
    transient = sum(at_peak.values()) - inventory.states.persistent - terms.resident
    components = dict(at_peak)
    components[MemCategory.ALLOCATOR_OVERHEAD] = round(ALLOCATOR_FRAGMENTATION * transient) + 2 * MiB
    components[MemCategory.OUTSIDE_PYTORCH] = base.components[MemCategory.OUTSIDE_PYTORCH]
    host = host_ram_bytes(policy, inventory)
    if terms.reference:  # the reference is loaded like the policy: one more replica per loading process
        host += host - inventory.states.host_per_node
    return BudgetResult(
        setup=setup, source=base.source, peak_phase=peak_phase,
        phases=MappingProxyType({p: MappingProxyType(c) for p, c in phases.items()}),
        components=MappingProxyType(components), host_ram_bytes=host, capacity_bytes=base.capacity_bytes,
        notes=(*terms.lines, *base.notes), outside_source=base.outside_source, load=base.load)
