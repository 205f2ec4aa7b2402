"""An optimizer stepped inside backward (torchtune's ``optimizer_in_bwd: True``): the backward phase's moments when
each parameter is stepped, and its gradient freed, as soon as that gradient is complete.

torchtune 0.4.0 builds one optimizer per parameter, ``{p: config.instantiate(cfg_optimizer, [p]) for p in
self._model.parameters()}`` (recipes/full_finetune_single_device.py :458-461), and registers
``p.register_post_accumulate_grad_hook(optim_step)`` on every trained parameter, where ``optim_step`` runs
``optim_dict[param].step()`` then ``optim_dict[param].zero_grad()`` (torchtune/training/memory.py :236-242);
``zero_grad`` sets the gradient to ``None`` (torch's default ``set_to_none=True``, torch/optim/optimizer.py :1024 at
2.13.0).  The training loop then calls no ``optimizer.step()`` after backward (full_finetune_single_device.py :704-712).
The recipe refuses ``clip_grad_norm`` and ``gradient_accumulation_steps > 1`` with it (:146-157), which no setup asks.

What this changes in the step budgeted by :func:`oomlab.budget.inventory.assemble_phases` (one process; make_setup
refuses the rest):

* no moment holds every gradient: a gradient lives from its ``AccumulateGrad`` to the end of its parameter's hook;
  the engine runs a ready ``AccumulateGrad`` before any other node, so one parameter steps at a time;
* the step's temporaries are per parameter: foreach AdamW over one tensor allocates one moment of that tensor
  (``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``, torch/optim/adam.py :790 at 2.13.0, what
  :mod:`.states` counts over every tensor after backward); fused AdamW, SGD and 8-bit AdamW update in place;
* a tied embedding's hook runs once, when both contributions are summed: the LM head's contribution waits in
  autograd's input buffer from the head's backward to the embedding's, then the sum -- three embedding-sized
  gradients at the very end (torchtune's ``TiedLinear`` is ``F.linear(x, tok_embeddings.weight)``,
  torchtune/modules/tied_linear.py :55-64);
* there is no optimizer phase after backward: the optimizer phase is the moment backward ends, the model states only.

NB: a parameter's step is counted at the largest moment it can meet (the head's at backward's start, every saved
activation held; a decoder weight's inside the top recomputed layer), an upper bound by one layer's tensors.
"""

from __future__ import annotations

from oomlab.budget.result import MemCategory
from oomlab.budget.step_parts import ModelStates, StepTensors
from oomlab.core.choices import Method, Optimizer
from oomlab.core.setup import TrainingSetup

__all__ = ["NOTE", "in_backward_candidates", "largest_layer_tensor", "pending_tied_bytes", "step_bytes"]

NOTE = ("optimizer stepped inside backward (torchtune's optimizer_in_bwd): one optimizer per parameter, stepped in its "
        "post-accumulate-grad hook and its gradient freed at once, so no moment holds every gradient; the step's "
        "temporaries are per parameter; nothing steps after backward")

Moment = dict[MemCategory, int]  # one moment's bytes by category

# optimizers whose step allocates one moment-sized temporary per tensor (foreach's sqrt, the loop's sqrt)
STEP_TEMPORARY = (Optimizer.ADAMW, Optimizer.ADAMW_HF)


def step_bytes(setup: TrainingSetup, states: ModelStates, params: int) -> int:
    """One parameter of ``params`` elements in its hook: its gradient, and the step's temporary (one moment, in the
    parameter's dtype like the gradient) where the optimizer allocates one."""
    grad = states.grad_bytes * params
    return grad + (grad if setup.optimizer in STEP_TEMPORARY else 0)


def largest_layer_tensor(setup: TrainingSetup) -> int:
    """Elements of the largest trained tensor inside a decoder layer: a projection (full fine-tuning) or an adapter
    matrix (``r x`` the larger side of its projection, LoRA)."""
    spec = setup.model
    dims = spec.projection_shapes
    if setup.method is Method.FULL:
        return max(i * o for i, o in dims.values())
    return max(setup.lora_rank * max(dims[t]) for t in setup.lora_targets)


def pending_tied_bytes(setup: TrainingSetup, states: ModelStates) -> int:
    """The LM head's contribution to a tied, trained embedding's gradient, held from the head's backward until the
    embedding's own arrives (0 untied or frozen)."""
    trained = setup.method is Method.FULL and setup.model.tie_word_embeddings
    return states.grad_bytes * setup.model.embedding_params if trained else 0


def in_backward_candidates(setup: TrainingSetup, s: ModelStates, t: StepTensors, held: Moment,
                           buckets: int) -> list[Moment]:
    """Backward's moments past its start (which :func:`~oomlab.budget.inventory.assemble_phases` keeps as it is):
    the head's step with every saved tensor held, a decoder weight's step inside the top recomputed layer, and the
    end (the embedding's step, or a tied embedding's summed gradient)."""
    spec, full = setup.model, setup.method is Method.FULL
    pending = pending_tied_bytes(setup, s)
    layer_step = step_bytes(setup, s, largest_layer_tensor(setup))
    # the head's hook (untied) -- or, tied, the head's contribution waiting while the top layer's weights step
    head = step_bytes(setup, s, spec.lm_head_params) if full and not pending else pending + layer_step
    candidates = [{**held, MemCategory.ACTIVATIONS: t.layer_activations,
                   MemCategory.GRADIENTS: head, MemCategory.WORKSPACE: t.autocast_copies + buckets}]
    if setup.checkpointing:
        candidates.append({**held, MemCategory.ACTIVATIONS: t.recompute_activations,
                           MemCategory.GRADIENTS: pending + layer_step,
                           MemCategory.WORKSPACE: t.recompute_workspace + buckets})
    if full:
        # tied: the waiting contribution, the embedding's own and their sum (then the step: the sum and one moment)
        end = 3 * pending if pending else step_bytes(setup, s, spec.embedding_params)
    else:
        end = layer_step  # the first layer's adapters
    carried = {k: v for k, v in ((MemCategory.ACTIVATIONS, t.carried_activations),
                                 (MemCategory.LOGITS_LOSS, t.carried_logits)) if v}
    candidates.append({**held, MemCategory.GRADIENTS: end, MemCategory.WORKSPACE: buckets, **carried})
    return candidates
