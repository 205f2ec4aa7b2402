"""FSDP's step as accelerate launches it, phase by phase: FSDP1 (``fsdp``, ``fsdp-offload``) and FSDP2 (``fsdp2``,
``fsdp2-offload``), each decoder layer its own unit.

The buffers are FSDP's own, as torch 2.13 holds them (read off the traces of :mod:`oomlab.budget.traced`, which run
accelerate's own prepare paths -- see :mod:`oomlab.budget.launchers`; the agreement matrix checks every count):

* FSDP1 (``FullyShardedDataParallel``, BACKWARD_PRE prefetch, ``limit_all_gathers``): the root unit (embedding, final
  norm, LM head) stays gathered from the start of forward to the end of backward; a decoder layer's gathered half
  parameters while it runs, the next one's too in backward (prefetch); in a trained layer's backward its half
  gradients and their reduce-scatter copy, and the LM head's half gradient (``use_orig_params``) held until the root's
  post-backward.  Frozen units (a LoRA base) are not resharded after backward: the root and one layer stay gathered
  through the optimizer step.
* FSDP2 (``fully_shard``, accelerate's grouping): the embedding group, each layer, and the ``[final norm, LM head]``
  group (kept gathered from its forward to its backward); gathering a layer holds its all-gather output and its
  copied-out parameters while the previous all-gather output is still held (freed by the next all-gather), and the
  reduce-scatter output of one trained layer is held until the next reduce-scatter.

Gradients are sharded fp32 (reduce-scatter in half, then cast); weights the sharded fp32 trained parameters and the
half frozen ones; activations those of :mod:`oomlab.budget.activations` in the regime the launch runs
(:func:`~oomlab.budget.activations.regime`).  The peak of a trained step's backward lies inside the second layer's
backward from the top (activations still high) or inside the last layers' (gradients almost all there), whichever is
larger: both are candidates, as are the start of backward and the end of forward.
"""

from __future__ import annotations

from oomlab.budget import activations as act
from oomlab.budget.result import MemCategory, Phase
from oomlab.budget.sharding import per_gpu
from oomlab.budget.states import NF4_DQ_BITS
from oomlab.budget.step_parts import Inventory
from oomlab.budget.workspace import in_layer_backward_bytes
from oomlab.core.choices import FSDP1_STRATEGIES, Method
from oomlab.core.setup import TrainingSetup

HALF = 2  # FSDP's mixed-precision param and reduce dtype (fp16 / bf16), and pure half precision's
W, G, M, S = MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.MASTER_WEIGHTS, MemCategory.OPTIMIZER_STATE
A, LG, X = MemCategory.ACTIVATIONS, MemCategory.LOGITS_LOSS, MemCategory.WORKSPACE


def layer_gathered_bytes(setup: TrainingSetup) -> int:
    """One decoder layer's parameters as FSDP gathers them (half), adapters included."""
    spec = setup.model
    params = spec.layer_params  # every parameter of the layer (LLaMA: projections + 2 h norms)
    if setup.method is not Method.FULL:
        params += spec.layer_lora_parameters(setup.lora_rank, setup.lora_targets)
    if setup.method is Method.QLORA:  # the projections gathered as NF4 (bnb_4bit_quant_storage = the half dtype)
        return HALF * (params - spec.layer_matmul_params) + round(spec.layer_matmul_params * NF4_DQ_BITS / 8)
    return HALF * params


def layer_grad_shard_bytes(setup: TrainingSetup, grad_bytes: int) -> int:
    """One layer's gradient as this GPU holds it (the trained parameters' only; :mod:`.sharding`'s share)."""
    spec = setup.model
    if setup.method is Method.FULL:
        params = spec.layer_params  # every parameter of the layer (LLaMA: projections + 2 h norms)
    else:
        params = spec.layer_lora_parameters(setup.lora_rank, setup.lora_targets)
    return per_gpu(setup, G, grad_bytes * params)


def outer_gathered_bytes(setup: TrainingSetup) -> tuple[int, int]:
    """(embedding group, tail group) as FSDP2 gathers them; FSDP1's root unit is their sum."""
    spec = setup.model
    if spec.tie_word_embeddings:  # accelerate puts the tied embedding in the tail group
        return 0, HALF * (spec.embedding_params + spec.hidden_size)
    return HALF * spec.embedding_params, HALF * (spec.lm_head_params + spec.hidden_size)


def backward_temporaries(setup: TrainingSetup) -> int:
    """Gradient temporaries inside one layer's backward: ``c (3 i + h)`` per token, as the recomputed-layer term.

    NB: the traced figure at the peak varies by where inside the layer the peak falls (150–260 MiB for 7B/13B at
    2,048 tokens); this term is the SwiGLU product's, SiLU's and up's gradients plus the hidden-state gradient.
    """
    spec = setup.model
    c = 4 if act.regime(setup) is act.Regime.FP32 else HALF
    return act.tokens(setup) * c * (3 * spec.intermediate_size + spec.hidden_size)


def fsdp_phases(setup: TrainingSetup, inventory: Inventory) -> dict[Phase, dict[MemCategory, int]]:
    """Allocated bytes by category in each phase of an FSDP step (see the module docstring), from the inventory's
    model states and step tensors (every tensor saved for backward at the end of forward but the loss's, and the
    per-layer terms)."""
    s, t, lt = inventory.states, inventory.tensors, inventory.layers
    if lt is None:
        raise ValueError(f"the inventory of {setup.strategy.value} carries no layer terms: take_inventory makes them "
                         "for the FSDP strategies")
    spec, trained = setup.model, setup.method is Method.FULL
    gradients, grad_bytes, layer_acts, per_layer = s.gradients, s.grad_bytes, t.layer_activations, lt.per_layer
    held = {W: s.weights, M: s.master_weights, S: s.optimizer_state}
    lh = layer_gathered_bytes(setup)
    g_layer = layer_grad_shard_bytes(setup, grad_bytes)
    embed, tail = outer_gathered_bytes(setup)
    tmp = in_layer_backward_bytes(setup, backward_temporaries(setup))  # QLoRA: with its dequantized projection
    if setup.checkpointing:
        layers = lt.layer_inputs
    else:
        layers = lt.first_layer + (spec.num_hidden_layers - 1) * per_layer + lt.rope
    # a layer's backward ends with the layer's own saved tensors gone (its checkpointed input stays until then)
    top = layers - (per_layer if setup.checkpointing else 2 * per_layer)
    bottom = per_layer + lt.rope  # the bottom layer's input (FSDP1) or the one below it (FSDP2)
    # the gradients of the outer units (their half parameter bytes: tail and embed are even), as this GPU holds them
    tail_grad, embed_grad = (per_gpu(setup, G, grad_bytes * n // HALF) for n in (tail, embed))
    outer_grads = per_gpu(setup, G, grad_bytes * (spec.embedding_params + spec.lm_head_params))
    fsdp1 = setup.strategy in FSDP1_STRATEGIES
    # NB: with checkpointing a trained layer's backward also holds its two recomputed norms' fp32 gradients
    # (read off the 7B/13B FSDP2 traces: 63-78 MiB at 2,048 tokens)
    recomputed_norm_grads = 2 * 4 * act.tokens(setup) * spec.hidden_size if setup.checkpointing else 0
    root = embed + tail
    if fsdp1:
        forward = [
            {**held, A: layer_acts, X: root + lh},  # the last layer done, still gathered
            {**held, A: layer_acts, LG: t.logits_forward, X: root},
        ]
        backward = [{**held, A: layer_acts, LG: t.loss_backward, X: root + lh}]  # the last layer prefetched
        if trained:
            head_grad = HALF * (spec.lm_head_params or spec.embedding_params) + lt.stream
            # the top layer's backward ends with the next prefetched: its half grads and their reduce-scatter copy
            backward.append({**held, A: top + per_layer, X: root + 4 * lh + head_grad})
            # the last layer's, every other gradient there (the root's come last)
            backward.append({**held, A: per_layer, G: gradients - 2 * g_layer - outer_grads,
                             X: root + 4 * lh + head_grad})
            backward.append({**held, G: gradients, X: root})
            if setup.checkpointing:
                # the bottom layer's recompute: the layer's saved tensors again beside its own input, almost every
                # gradient already reduced, the head's half gradient still held
                backward.append({**held, A: bottom + lt.first_layer + lt.layer_fixed,
                                 G: gradients - 2 * g_layer - outer_grads, X: root + 2 * lh + head_grad + tmp})
            optimizer = {**held, G: gradients, X: s.optimizer_temps}
        else:
            backward.append({**held, A: layer_acts - per_layer, G: gradients, X: root + 2 * lh + tmp})
            # frozen units are not resharded after backward; a recomputed one is, in its own post-forward
            optimizer = {**held, G: gradients, X: root + (0 if setup.checkpointing else lh) + s.optimizer_temps}
        buffers = root + 2 * lh
    else:
        forward = [
            {**held, A: layer_acts - per_layer, X: 3 * lh},  # entering the last layer
            {**held, A: layer_acts, LG: t.logits_forward, X: 2 * tail},
        ]
        backward = [{**held, A: layer_acts, LG: t.loss_backward, X: tail}]
        if trained:
            # inside the second layer from the top: the top's gradient shard and reduce-scatter output held
            backward.append({**held, A: top, G: tail_grad + g_layer, X: 4 * lh + tmp + recomputed_norm_grads})
            # inside the second layer from the bottom
            backward.append({**held, A: 2 * per_layer, G: gradients - 2 * g_layer - embed_grad,
                             X: 4 * lh + tmp + recomputed_norm_grads})
            backward.append({**held, G: gradients, X: lh + embed})
            if setup.checkpointing:
                # the second layer from the bottom, recomputed: the inputs below it, its saved tensors again
                backward.append({**held, A: bottom + lt.layer_saved + lt.layer_fixed,
                                 G: gradients - 2 * g_layer - embed_grad, X: 3 * lh + lt.stream + tmp})
        else:
            backward.append({**held, A: layer_acts - per_layer, G: gradients, X: 2 * lh + tmp})
        optimizer = {**held, G: gradients, X: s.optimizer_temps}
        buffers = (3 if trained else 2) * lh
    if setup.checkpointing and not fsdp1:
        # FSDP2, inside the top layer's recomputed backward: every layer's input held, the recomputed inventory and its
        # gradient temporaries (what the recompute saves counts as activations, as traced)
        grads = tail_grad if trained else gradients
        backward.append({**held, A: lt.layer_inputs + lt.layer_saved + lt.layer_fixed, G: grads, X: buffers + tmp})
    pick = lambda cands: max(cands, key=lambda d: sum(d.values()))  # noqa: E731
    return {Phase.FORWARD: pick(forward), Phase.BACKWARD: pick(backward), Phase.OPTIMIZER: optimizer}
