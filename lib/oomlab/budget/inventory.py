"""One pass through a setup: every byte count its step is made of, computed once into an :class:`Inventory`,
then each phase assembled from it (:func:`assemble_phases`).

One optimizer step in steady state (the optimizer state already exists, gradients are set to ``None``
after each step) is split into three phases; the peak is the largest phase total, not a sum of maxima:

* ``forward``: weights, optimizer state, everything saved for backward, the logits and the loss;
* ``backward``: at its start (saved tensors still held, loss gradients appear), inside a trained FSDP layer, at
  its end (every gradient held, activations freed) or -- with checkpointing -- inside a recomputed layer,
  whichever is largest;
* ``optimizer``: weights, gradients, optimizer state and the optimizer's temporaries.

FSDP's phases are :mod:`.fsdp`'s, DeepSpeed's :mod:`.deepspeed`'s (from the same step tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.budget import activations as act
from oomlab.budget import states, workspace
from oomlab.budget.deepspeed import deepspeed_phases, model_dtype_bytes, zero_states
from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.fsdp import fsdp_phases
from oomlab.budget.result import MemCategory, Phase
from oomlab.core.choices import Method
from oomlab.core.setup import TrainingSetup


@dataclass(frozen=True)
class ModelStates:
    """Per-GPU bytes that do not depend on the micro-batch or the length (memoised: searches vary only those)."""

    weights: int
    gradients: int  # all of them, at the end of backward
    master_weights: int
    optimizer_state: int
    optimizer_temps: int  # inside optimizer.step()
    ddp_buckets: int
    grad_bytes: int  # bytes per trained parameter of its gradient
    held_gradients: int = 0  # gradient buffers held all step (DeepSpeed ZeRO-3's partitions, BF16_Optimizer's)

    @property
    def persistent(self) -> int:
        """Bytes held all step long: weights, master weights, optimizer state (and permanent gradient buffers)."""
        return self.weights + self.master_weights + self.optimizer_state + self.held_gradients


@dataclass(frozen=True)
class StepTensors:
    """Per-GPU bytes of one micro-batch: saved activations, logits and loss, autocast's weight copies."""

    layer_activations: int  # saved for backward at the end of forward (the loss's own tensors excluded)
    autocast_copies: int  # half weight copies that backward still needs
    autocast_cache: int  # every weight's half copy, held until the outermost autocast exits
    logits: int  # the LM head's output
    logits_fp32: int  # logits.float() inside the loss
    log_softmax: int  # saved by cross_entropy
    loss_grad: int  # one (tokens x vocab) fp32 gradient
    recompute_activations: int  # checkpointing: every layer's input + the recomputed layer's saved tensors
    recompute_workspace: int  # checkpointing: the recomputed layer's fixed bytes and gradient temporaries


@dataclass(frozen=True)
class Inventory:
    """Everything one setup's step is assembled from."""

    states: ModelStates
    tensors: StepTensors
    deepspeed: DeepSpeedSettings | None = None  # DeepSpeed's knobs (None: the defaults; only DeepSpeed reads them)


_STATES: dict[tuple, ModelStates] = {}


def model_states(setup: TrainingSetup, deepspeed: DeepSpeedSettings | None = None) -> ModelStates:
    """The setup's :class:`ModelStates`, memoised on what they depend on."""
    key = (setup.model, setup.method._value_, setup.precision._value_, setup.strategy._value_,
           setup.optimizer._value_, setup.world_size, setup.lora_rank, setup.lora_targets, setup.checkpointing,
           deepspeed)
    found = _STATES.get(key)
    if found is None and setup.strategy.deepspeed:
        z = zero_states(setup, deepspeed)
        found = _STATES[key] = ModelStates(
            weights=z.weights, gradients=z.gradients, master_weights=z.master, optimizer_state=z.optimizer,
            optimizer_temps=z.step_temps, ddp_buckets=0, grad_bytes=model_dtype_bytes(setup),
            held_gradients=z.held_gradients)
    if found is None:
        found = _STATES[key] = ModelStates(
            weights=states.weights_on_gpu(setup), gradients=states.gradients_on_gpu(setup),
            master_weights=states.master_weights_on_gpu(setup), optimizer_state=states.optimizer_on_gpu(setup),
            optimizer_temps=states.optimizer_temp_bytes(setup), ddp_buckets=workspace.ddp_bucket_bytes(setup),
            grad_bytes=states.grad_bytes_per_param(setup),
        )
    return found


def step_tensors(setup: TrainingSetup) -> StepTensors:
    """The setup's :class:`StepTensors` (token-scaled; the per-regime inventories behind them are memoised)."""
    saved = act.saved_activation_bytes(setup)
    capped = act.softcap_saved_bytes(setup)  # Gemma-2's saved tanh(logits): logits-sized, held with log_softmax
    loss_saved = act.tokens(setup) * (4 * setup.model.vocab_size + act.INDEX) + capped
    lg = workspace.logits_bytes(setup)
    recompute_acts = recompute_fixed = 0
    if setup.checkpointing:
        # by then the head, the final norm and the loss have run their backward: only the layers' inputs remain,
        # plus the recomputed (top) layer's whole inventory and its gradient temporaries
        inputs = setup.model.num_hidden_layers * act.checkpoint_layer_bytes(setup) + act.rope_bytes(setup)
        recompute_acts = inputs + act.layer_activation_bytes(setup)
        recompute_fixed = act.layer_fixed_bytes(setup) + workspace.in_layer_backward_bytes(
            setup, workspace.recompute_gradient_bytes(setup))
    return StepTensors(
        layer_activations=saved - loss_saved, autocast_copies=act.autocast_copy_bytes(setup),
        autocast_cache=act.autocast_cache_bytes(setup), logits=lg["logits"], logits_fp32=lg["fp32 copy"],
        log_softmax=lg["log_softmax"] + capped, loss_grad=lg["grad"], recompute_activations=recompute_acts,
        recompute_workspace=recompute_fixed,
    )


def take_inventory(setup: TrainingSetup, deepspeed: DeepSpeedSettings | None = None) -> Inventory:
    return Inventory(model_states(setup, deepspeed), step_tensors(setup), deepspeed)


def assemble_phases(setup: TrainingSetup, inventory: Inventory) -> dict[Phase, dict[MemCategory, int]]:
    """Allocated bytes by category in each phase, each phase at its own largest moment."""
    s, t = inventory.states, inventory.tensors
    if setup.strategy.deepspeed:
        return deepspeed_phases(setup, zero_states(setup, inventory.deepspeed), {
            "layer_activations": t.layer_activations, "logits_forward": t.logits + t.logits_fp32 + t.log_softmax,
            "loss_backward": t.log_softmax + 2 * t.loss_grad, "logits_grad": t.logits,
            "recompute_activations": t.recompute_activations,
            "recompute_workspace": t.recompute_workspace})
    if setup.strategy.fsdp:
        return fsdp_phases(setup, s.weights, s.master_weights, s.optimizer_state, s.gradients, s.optimizer_temps,
                           s.grad_bytes, t.layer_activations, {"logits": t.logits, "fp32 copy": t.logits_fp32,
                                                                "log_softmax": t.log_softmax, "grad": t.loss_grad})
    held = {MemCategory.WEIGHTS: s.weights, MemCategory.MASTER_WEIGHTS: s.master_weights,
            MemCategory.OPTIMIZER_STATE: s.optimizer_state}
    buckets = s.ddp_buckets
    forward = {
        **held,
        MemCategory.ACTIVATIONS: t.layer_activations,
        MemCategory.LOGITS_LOSS: t.logits + t.logits_fp32 + t.log_softmax,
        # autocast's cache holds every weight's half copy until the outermost autocast exits (end of
        # forward), checkpointed or not
        MemCategory.WORKSPACE: max(t.autocast_copies, t.autocast_cache) + buckets,
    }
    candidates = [
        {  # start: the loss gradients, every saved tensor still held
            **held,
            MemCategory.ACTIVATIONS: t.layer_activations,
            MemCategory.LOGITS_LOSS: t.log_softmax + 2 * t.loss_grad,
            MemCategory.WORKSPACE: t.autocast_copies + buckets,
        },
        {  # end: every gradient held, activations freed
            **held, MemCategory.GRADIENTS: s.gradients, MemCategory.WORKSPACE: buckets,
        },
    ]
    if setup.model.tie_word_embeddings and setup.method is Method.FULL:
        # the tied embedding's gradient, last of all: autograd holds the LM head's contribution until the embedding's
        # own arrives, then sums the two into a third tensor before AccumulateGrad keeps it -- three embedding-sized
        # gradients at once, every other gradient held (the peak when the embedding is over half the model)
        tied = s.grad_bytes * setup.model.embedding_params
        candidates.append({**held, MemCategory.GRADIENTS: s.gradients - tied,
                           MemCategory.WORKSPACE: 3 * tied + buckets})
    if setup.checkpointing:
        # inside the top recomputed layer: every layer input still held, few gradients yet.  LoRA's adapter
        # gradients (small) are held throughout.  NB: full fine-tuning's gradients grow as the layers go by while
        # their inputs are freed; the end-of-backward candidate covers the bottom of that range.
        trained = s.gradients if setup.method is not Method.FULL else 0
        candidates.append({**held, MemCategory.ACTIVATIONS: t.recompute_activations, MemCategory.GRADIENTS: trained,
                           MemCategory.WORKSPACE: t.recompute_workspace + buckets})
    backward = max(candidates, key=lambda d: sum(d.values()))
    optimizer = {**held, MemCategory.GRADIENTS: s.gradients, MemCategory.WORKSPACE: buckets + s.optimizer_temps}
    return {Phase.FORWARD: forward, Phase.BACKWARD: backward, Phase.OPTIMIZER: optimizer}


def live_components(setup: TrainingSetup, inventory: Inventory) -> dict[Phase, frozenset[MemCategory]]:
    """What the inventory says is alive at every moment of each phase (whichever moment is its largest).

    In a steady-state step the weights, the master weights and the optimizer state (each where the setup has them on
    the GPU) live through every phase; the forward holds the saved activations from its last layer on; the optimizer
    step holds every gradient.  Backward's largest moment may be its start, a recomputed layer or its end, so it must
    hold the persistent states (and either activations or gradients).  The logits live only from the LM head on:
    :func:`forward_end_bytes` is that moment, which no forward phase may fall below.
    """
    s, t = inventory.states, inventory.tensors
    held = {MemCategory.WEIGHTS: s.weights, MemCategory.MASTER_WEIGHTS: s.master_weights,
            MemCategory.OPTIMIZER_STATE: s.optimizer_state}
    persistent = frozenset(k for k, v in held.items() if v)
    return {Phase.FORWARD: persistent | ({MemCategory.ACTIVATIONS} if t.layer_activations else set()),
            Phase.BACKWARD: persistent,
            Phase.OPTIMIZER: persistent | ({MemCategory.GRADIENTS} if s.gradients else set())}


def forward_end_bytes(inventory: Inventory) -> int:
    """The forward's end, every tensor then alive: the persistent states, the saved activations, the logits, their
    fp32 copy and the loss's saved log-softmax."""
    s, t = inventory.states, inventory.tensors
    return s.persistent + t.layer_activations + t.logits + t.logits_fp32 + t.log_softmax
