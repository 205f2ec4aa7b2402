"""The public budget: :func:`estimate` of a setup given by names, analytic (microseconds) or traced (seconds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import SOURCES, BudgetResult, Source
from oomlab.budget.traced import traced_budget
from oomlab.core.defaults import DEFAULTS
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.setup import make_setup
from oomlab.core.versions import Versions

# Name lookups and validation, once per distinct input (typed: 2 and 2.0, 1 and True stay apart, as validate tells them
# apart); a refused input raises every time (lru_cache keeps no exception).  Setups are frozen, so sharing is safe.
_validated_setup = lru_cache(maxsize=4096, typed=True)(make_setup)


def estimate(
    model: str = DEFAULTS.model,
    gpu: str = DEFAULTS.gpu,
    gpus: int = DEFAULTS.gpus,
    nodes: int = DEFAULTS.nodes,
    strategy: str | None = None,
    method: str = DEFAULTS.method.value,
    precision: str = DEFAULTS.precision.value,
    optimizer: str = DEFAULTS.optimizer.value,
    batch: int = DEFAULTS.batch,
    seq: int = DEFAULTS.seq,
    checkpointing: bool = DEFAULTS.checkpointing,
    attention: str = DEFAULTS.attention.value,
    lora_rank: int = DEFAULTS.lora_rank,
    lora_alpha: int = DEFAULTS.lora_alpha,
    lora_targets: Sequence[str] | str = DEFAULTS.lora_targets,
    trainer: str = DEFAULTS.trainer.value,
    reference: str = DEFAULTS.reference.value,
    loss: str = DEFAULTS.loss.value,
    offload_activations: bool = DEFAULTS.offload_activations,
    base_dtype: str = DEFAULTS.base_dtype.value,
    optimizer_in_backward: bool = DEFAULTS.optimizer_in_backward,
    source: str = "analytic",
    outside_bytes: int | None = None,
    deepspeed: DeepSpeedSettings | None = None,
    versions: Versions | Mapping[str, str] | str | None = None,
) -> BudgetResult:
    """Per-GPU memory of one training step of ``model`` on ``gpus`` × ``gpu`` (see :func:`make_setup`); what is not
    given is :data:`~oomlab.core.defaults.DEFAULTS`' (the seed's 4 × T4, a replica per GPU), the same run ``python -m
    oomlab budget`` and the pipeline budget with no options; no ``strategy``: a replica per GPU, one process on one.

    ``source="traced"`` runs PyTorch's MemTracker on fake tensors instead (seconds; :mod:`oomlab.budget.traced`).
    ``versions``: the user's library releases (``{"transformers": "4.48.1"}``, ``"torch==2.0.1,..."`` or a pip freeze
    file; :mod:`oomlab.core.versions`), the installed ones for every package not given (the notes say which).
    ``trainer``: the training loop (``sft``, ``dpo``, ``orpo``, ``kto``, ``grpo``, ``ppo``, ``reward``) and
    ``reference`` its reference model (``default``, ``resident``, ``none``): :mod:`oomlab.budget.trainers`.
    ``loss``: ``standard`` (transformers' loss over materialised logits), ``liger-flce`` (Liger's fused linear
    cross-entropy), ``cce`` (Cut Cross-Entropy) or a framework's chunked loss (:class:`~oomlab.core.choices.Loss`):
    :mod:`oomlab.budget.loss_kernels`; ``offload_activations``: TRL's
    activation offloading (:mod:`oomlab.budget.activation_offload`); ``base_dtype``: LoRA's frozen base as loaded,
    ``half`` or ``float32`` (transformers 4.x without ``torch_dtype``; :func:`oomlab.budget.states.fp32_loaded_base`).
    ``optimizer_in_backward``: each parameter stepped inside backward as its gradient completes (torchtune's
    ``optimizer_in_bwd``; :mod:`oomlab.budget.optimizer_in_backward`), one process only.
    ``deepspeed``: DeepSpeed's knobs for the ``zero*`` strategies (default: what the HF integration resolves
    ``"auto"`` to; read a user's JSON with :func:`oomlab.budget.deepspeed_config.read_deepspeed_config`).
    """
    if source not in SOURCES:
        raise UnknownNameError("source", source, SOURCES)
    args = (model, gpu, gpus, nodes, strategy, method, precision, optimizer, batch, seq, checkpointing, attention,
            lora_rank, lora_alpha, tuple(lora_targets) if isinstance(lora_targets, list) else lora_targets, trainer,
            reference, loss, offload_activations, base_dtype)
    try:
        setup = _validated_setup(*args, versions=versions, optimizer_in_backward=optimizer_in_backward)
    except TypeError:  # an unhashable argument: validate it without the memo (same result, same errors)
        setup = make_setup(*args, versions=versions, optimizer_in_backward=optimizer_in_backward)
    if source == Source.ANALYTIC.value:
        return estimate_setup(setup, outside_bytes, deepspeed)
    if setup.strategy.deepspeed:
        raise InvalidValueError(
            f"strategy {setup.strategy.value!r} is analytic only: DeepSpeed's engine needs real tensors and processes "
            "(no FakeTensorMode trace); use source='analytic' (checked against real CPU runs: "
            "docs/deepspeed-small-scale.md)")
    return traced_budget(setup, outside_bytes)
