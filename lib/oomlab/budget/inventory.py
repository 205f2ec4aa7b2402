"""One pass through a setup: every byte count its step is made of, computed once into an :class:`Inventory`,
then each phase assembled from it (:func:`assemble_phases`).

One optimizer step in steady state (the optimizer state already exists, gradients are set to ``None``
after each step) is split into three phases; the peak is the largest phase total, not a sum of maxima:

* ``forward``: weights, optimizer state, everything saved for backward, the logits and the loss;
* ``backward``: at its start (saved tensors still held, loss gradients appear), inside a trained FSDP layer, at
  its end (every gradient held, activations freed) or -- with checkpointing -- inside a recomputed layer,
  whichever is largest;
* ``optimizer``: weights, gradients, optimizer state and the optimizer's temporaries.

An optimizer stepped inside backward (``setup.optimizer_in_backward``, torchtune's ``optimizer_in_bwd``) replaces
backward's later moments with its own and leaves the optimizer phase the model states alone
(:mod:`.optimizer_in_backward`).

The parts are typed (:mod:`.step_parts`): the model states (DeepSpeed's ``ZeroStates`` too, computed once) and
the step tensors with the per-layer terms.  FSDP's phases are :mod:`.fsdp`'s, DeepSpeed's :mod:`.deepspeed`'s, each
reading the same :class:`Inventory`.
"""

from __future__ import annotations

from oomlab.budget import activations as act
from oomlab.budget import states, workspace
from oomlab.budget.activation_offload import offload_tensors
from oomlab.budget.deepspeed import deepspeed_phases, model_dtype_bytes, zero_states
from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.frameworks import framework_states, litgpt_tensors
from oomlab.budget.fsdp import fsdp_phases
from oomlab.budget.loss_kernels import loss_tensors
from oomlab.budget.optimizer_in_backward import in_backward_candidates
from oomlab.budget.result import MemCategory, Phase
from oomlab.budget.step_parts import Inventory, LayerTerms, ModelStates, StepTensors
from oomlab.core.choices import Method, Precision
from oomlab.core.memo import BoundedMemo
from oomlab.core.setup import TrainingSetup
from oomlab.core.versions import Fact, applies

_STATES: BoundedMemo[tuple, ModelStates] = BoundedMemo()


def model_states(setup: TrainingSetup, deepspeed: DeepSpeedSettings | None = None) -> ModelStates:
    """The setup's :class:`ModelStates`, memoised on what they depend on."""
    key = (setup.model, setup.method._value_, setup.precision._value_, setup.strategy._value_,
           setup.optimizer._value_, setup.gpus, setup.nodes, setup.lora_rank, setup.lora_targets, setup.checkpointing,
           deepspeed, setup.versions, setup.base_dtype._value_)
    found = _STATES.get(key)
    if found is None and setup.strategy.deepspeed:
        z = zero_states(setup, deepspeed)
        found = _STATES[key] = ModelStates(
            weights=z.weights, gradients=z.gradients, master_weights=z.master, optimizer_state=z.optimizer,
            optimizer_temps=z.step_temps, ddp_buckets=0, grad_bytes=model_dtype_bytes(setup),
            held_gradients=z.held_gradients, replica=states.weight_bytes_total(setup),
            host_per_node=setup.gpus * z.host)
    if found is None:
        found = _STATES[key] = framework_states(setup, ModelStates(
            weights=states.weights_on_gpu(setup), gradients=states.gradients_on_gpu(setup),
            # torch's mixed precision keeps no master copy: the fp32 weights are the master (DeepSpeed's: ZeroStates)
            master_weights=0, optimizer_state=states.optimizer_on_gpu(setup),
            optimizer_temps=states.optimizer_temp_bytes(setup), ddp_buckets=workspace.ddp_bucket_bytes(setup),
            grad_bytes=states.grad_bytes_per_param(setup), held_gradients=0,
            # the offloaded states, unsharded: a node's ranks hold 1 / nodes of them on its host
            replica=states.weight_bytes_total(setup), host_per_node=states.host_bytes_total(setup) // setup.nodes,
        ))  # litgpt's or torchtune's own where the versions name one (.frameworks)
    return found


def step_tensors(setup: TrainingSetup) -> StepTensors:
    """The setup's :class:`StepTensors` (token-scaled; the per-regime inventories behind them are memoised)."""
    saved = act.saved_activation_bytes(setup)
    capped = act.softcap_saved_bytes(setup)  # Gemma-2's saved tanh(logits): logits-sized, held with log_softmax
    loss_saved = act.tokens(setup) * (4 * setup.model.vocab_size + act.INDEX) + capped
    lg = workspace.logits_bytes(setup)
    logits, logits_fp32 = logits_at_loss(setup, lg.logits, lg.fp32_copy)
    recompute_acts = recompute_fixed = 0
    if setup.checkpointing:
        # by then the head, the final norm and the loss have run their backward: only the layers' inputs remain,
        # plus the recomputed (top) layer's whole inventory and its gradient temporaries
        recompute_acts = layer_inputs_bytes(setup) + act.layer_activation_bytes(setup)
        recompute_fixed = act.layer_fixed_bytes(setup) + workspace.in_layer_backward_bytes(
            setup, workspace.recompute_gradient_bytes(setup))
    # a fused loss (Liger, Cut Cross-Entropy) replaces the logits' terms, litgpt's loop under Fabric its own;
    # offloading moves the saved activations
    return offload_tensors(setup, litgpt_tensors(setup, loss_tensors(setup, StepTensors(
        layer_activations=saved - loss_saved, autocast_copies=act.autocast_copy_bytes(setup),
        autocast_cache=act.autocast_cache_bytes(setup), logits=logits, logits_fp32=logits_fp32,
        log_softmax=lg.log_softmax + capped, loss_grad=lg.grad, recompute_activations=recompute_acts,
        recompute_workspace=recompute_fixed, input_leaf=act.input_leaf_bytes(setup),
    ))))


def logits_at_loss(setup: TrainingSetup, half_logits: int, fp32_copy: int) -> tuple[int, int]:
    """(the LM head's output, the fp32 copies) alive when the loss runs, by the user's transformers release.

    From 4.49 ``ForCausalLMLoss`` upcasts the returned half logits and shifts the labels: the half logits and one fp32
    copy (:func:`.workspace.logits_bytes`).  Before 4.49 it shifted the logits, ``logits[..., :-1, :].contiguous()``:
    a second fp32 (tokens x vocab) copy (:attr:`~oomlab.core.versions.Fact.LOSS_SHIFTS_LABELS`).  Before 4.46
    ``LlamaForCausalLM.forward`` ran ``logits = logits.float()`` itself: the half logits are freed at once, the fp32
    ones returned (:attr:`~oomlab.core.versions.Fact.LOSS_UPCASTS_LOGITS`).
    NB: tokens x vocab, not (tokens - batch) x vocab, for the shifted copy.
    """
    shifted = 4 * act.tokens(setup) * setup.model.vocab_size
    if not applies(Fact.LOSS_SHIFTS_LABELS, setup.versions):
        fp32_copy += shifted
    if not applies(Fact.LOSS_UPCASTS_LOGITS, setup.versions) and setup.precision is not Precision.FP32:
        half_logits = 0
    return half_logits, fp32_copy


def layer_inputs_bytes(setup: TrainingSetup) -> int:
    """Every layer's input (one hidden-state tensor each) and RoPE's tensors: what checkpointing keeps."""
    return setup.model.num_hidden_layers * act.checkpoint_layer_bytes(setup) + act.rope_bytes(setup)


def layer_terms(setup: TrainingSetup) -> LayerTerms:
    """One decoder layer's :class:`LayerTerms` (FSDP's phases read them)."""
    saved, stream = act.layer_activation_bytes(setup), act.checkpoint_layer_bytes(setup)
    return LayerTerms(layer_saved=saved, first_layer=act.first_layer_activation_bytes(setup),
                      layer_fixed=act.layer_fixed_bytes(setup), stream=stream, rope=act.rope_bytes(setup),
                      per_layer=stream if setup.checkpointing else saved, layer_inputs=layer_inputs_bytes(setup))


def take_inventory(setup: TrainingSetup, deepspeed: DeepSpeedSettings | None = None) -> Inventory:
    """The setup's :class:`Inventory`: its model states (DeepSpeed's layout too) and its step tensors, once."""
    zero = zero_states(setup, deepspeed) if setup.strategy.deepspeed else None
    layers = layer_terms(setup) if setup.strategy.fsdp else None
    return Inventory(model_states(setup, deepspeed), step_tensors(setup), deepspeed, zero, layers)


def assemble_phases(setup: TrainingSetup, inventory: Inventory) -> dict[Phase, dict[MemCategory, int]]:
    """Allocated bytes by category in each phase, each phase at its own largest moment."""
    s, t = inventory.states, inventory.tensors
    if setup.strategy.deepspeed:
        return deepspeed_phases(setup, inventory)
    if setup.strategy.fsdp:
        return fsdp_phases(setup, inventory)
    held = {MemCategory.WEIGHTS: s.weights, MemCategory.MASTER_WEIGHTS: s.master_weights,
            MemCategory.OPTIMIZER_STATE: s.optimizer_state}
    buckets = s.ddp_buckets + t.input_leaf  # both held through every phase
    forward = {
        **held,
        MemCategory.ACTIVATIONS: t.layer_activations,
        MemCategory.LOGITS_LOSS: t.logits_forward,
        # autocast's cache holds every weight's half copy until the outermost autocast exits (end of
        # forward), checkpointed or not
        MemCategory.WORKSPACE: max(t.autocast_copies, t.autocast_cache) + buckets,
    }
    if t.head_forward or t.carried:
        # litgpt: past the last layer, before its loop rebinds ``logits``: the head's output (Fabric's fp32 copies) with
        # the previous micro-batch's logits and graph still held
        head = {**forward, MemCategory.ACTIVATIONS: t.layer_activations + t.carried_activations,
                MemCategory.LOGITS_LOSS: t.head_forward + t.carried_logits}
        forward = max(forward, head, key=lambda d: sum(d.values()))
    carried = {MemCategory.ACTIVATIONS: t.carried_activations, MemCategory.LOGITS_LOSS: t.carried_logits}
    carried = {k: v for k, v in carried.items() if v}  # held past backward and through the step (litgpt's loop)
    start = {  # the loss gradients, every saved tensor still held
        **held,
        MemCategory.ACTIVATIONS: t.layer_activations,
        MemCategory.LOGITS_LOSS: t.loss_backward,
        MemCategory.WORKSPACE: t.autocast_copies + buckets,
    }
    if setup.optimizer_in_backward:  # each parameter stepped as its gradient completes: no gradient held after
        backward = max([start, *in_backward_candidates(setup, s, t, held, buckets)], key=lambda d: sum(d.values()))
        return {Phase.FORWARD: forward, Phase.BACKWARD: backward,
                Phase.OPTIMIZER: {**held, MemCategory.WORKSPACE: buckets, **carried}}
    candidates = [
        start,
        {  # end: every gradient held, activations freed
            **held, MemCategory.GRADIENTS: s.gradients, MemCategory.WORKSPACE: buckets, **carried,
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
    optimizer = {**held, MemCategory.GRADIENTS: s.gradients, MemCategory.WORKSPACE: buckets + s.optimizer_temps,
                 **carried}
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
            Phase.OPTIMIZER: persistent | ({MemCategory.GRADIENTS} if s.gradients and not setup.optimizer_in_backward
                                           else set())}


def forward_end_bytes(inventory: Inventory) -> int:
    """The forward's end, every tensor then alive: the persistent states, the saved activations, the logits, their
    fp32 copy and the loss's saved log-softmax."""
    s, t = inventory.states, inventory.tensors
    return s.persistent + t.layer_activations + t.logits_forward
