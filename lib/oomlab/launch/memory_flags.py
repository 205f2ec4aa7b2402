"""Launch settings that move memory beside the setup's core fields: the loss kernel (modelled: ``loss``), and the
settings oomlab refuses or lists with their likely effect.

- **The loss** (:class:`~oomlab.core.choices.Loss`, budgeted by :mod:`oomlab.budget.loss_kernels`):
  TrainingArguments / TRL ``use_liger_kernel`` (transformers 5.24 ``trainer.py`` :1494-1495 calls Liger's
  ``_apply_liger_kernel_to_instance(model, **liger_kernel_config)``, whose ``fused_linear_cross_entropy`` defaults
  to on; ``liger_kernel_config: {fused_linear_cross_entropy: false}`` keeps the logits); LLaMA-Factory
  ``enable_liger_kernel`` (``model_utils/liger_kernel.py`` :30-97 at 355d5c5e: the fused loss only for stages pt and
  sft -- ``require_logits`` turns it off for the others); axolotl ``liger_fused_linear_cross_entropy`` and
  ``cut_cross_entropy``, each applied by its plugin (``axolotl.integrations.liger.LigerPlugin``,
  ``axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin``) listed under ``plugins``.
- **Activation offloading** (``offload_activations``, budgeted by :mod:`oomlab.budget.activation_offload`): TRL's
  and axolotl's ``activation_offloading``, torchtune's ``enable_activation_offloading``.
- **Refused** (:class:`~oomlab.core.errors.UnmodelledSettingError`): context parallelism, an optimizer stepped
  inside backward (LOMO / AdaLomo, torchtune's ``optimizer_in_bwd``), selective activation checkpointing.
- **Listed, not refused**: ``torch_compile`` (its effect on memory is small and mostly downward: the eager budget
  stands, said so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oomlab.core.choices import Loss
from oomlab.core.errors import UnmodelledSettingError
from oomlab.core.user_input import shown
from oomlab.launch.claims import Claims
from oomlab.launch.origin import Origin, Unmodelled

Lookup = Callable[[str], tuple[bool, Any, Origin]]

LIGER_KEYS = ("use_liger_kernel", "liger_kernel_config", "enable_liger_kernel", "liger_fused_linear_cross_entropy",
              "cut_cross_entropy")
LIGER_PLUGIN = "axolotl.integrations.liger"  # axolotl's LigerPlugin module (a plugins entry starts with it)
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy"
LLAMAFACTORY_FUSED_STAGES = ("pt", "sft")  # liger_kernel.py: require_logits is stage not in ["pt", "sft"]

# What oomlab budgets of the step, said by every refusal
MODELLED = ("oomlab budgets every rank holding its micro-batch's whole sequences, the optimizer stepped after "
            "backward with every gradient held, and activation checkpointing of whole decoder layers (or none)")


def _on(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _above_one(value: Any) -> bool:
    try:
        return int(value) > 1
    except (TypeError, ValueError):
        return False


_SELECTIVE_AC = ("selective",)
_HARMLESS_CHECKPOINT_KWARGS = frozenset({"use_reentrant", "preserve_rng_state", "determinism_check", "debug"})


def _policy_kwargs(value: Any) -> bool:
    """``gradient_checkpointing_kwargs`` beyond torch.utils.checkpoint's switches that save the same tensors."""
    return isinstance(value, dict) and bool(set(value) - _HARMLESS_CHECKPOINT_KWARGS)


# (key, is it on?, what it does): settings that move memory and are not budgeted
REFUSED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("context_parallel_size", _above_one, "context parallelism: each rank holds 1/N of every sequence's activations "
                                          "and attention runs as a ring over the N ranks"),
    ("cp_size", _above_one, "context parallelism (1/N of every sequence per rank)"),
    ("sequence_parallel_degree", _above_one, "axolotl's sequence parallelism (ring attention: 1/N of every sequence "
                                             "per rank)"),
    ("sequence_parallel_size", _above_one, "sequence parallelism (1/N of every sequence per rank)"),
    ("parallelism_config.cp_size", _above_one, "accelerate's ParallelismConfig context parallelism"),
    ("parallelism_config.parallelism_config_cp_size", _above_one, "accelerate's ParallelismConfig context "
                                                                  "parallelism"),
    ("optimizer_in_bwd", _on, "torchtune's optimizer-in-backward: each parameter stepped and its gradient freed as "
                              "soon as it is computed (no full set of gradients is ever held); oomlab budgets it for "
                              "torchtune's own recipe (oomlab budget --optimizer-in-backward), not in this launch's "
                              "trainer"),
    ("ac_mode", lambda v: str(v).strip().lower() in _SELECTIVE_AC,
     "torchtune's selective activation checkpointing (per op, or every k-th layer via ac_option)"),
    ("gradient_checkpointing_kwargs", _policy_kwargs,
     "checkpointing with a non-default policy (what each layer saves changes with it)"),
)
OPTIM_IN_BACKWARD = {"lomo": "LOMO (transformers optim 'lomo')", "adalomo": "AdaLomo (transformers optim 'adalomo')"}
_OPTIM_KEYS = ("optim", "optimizer")
TORCH_COMPILE = ("torch.compile of the model: AOTAutograd's partitioner recomputes cheap pointwise ops rather than "
                 "saving them and Inductor fuses them, so activations are usually at or below the eager budget's "
                 "(plus a one-off compile-time peak); budgeted as the eager model")
# keys read here: the launch readers count them as modelled
# TRL's SFTConfig and axolotl: activation_offloading; torchtune: enable_activation_offloading
OFFLOAD_KEYS = ("activation_offloading", "enable_activation_offloading")
KEYS = frozenset({*LIGER_KEYS, *(k for k, _, _ in REFUSED), *OFFLOAD_KEYS, "torch_compile", "plugins"})


def refuse(key: str, value: Any, origin: Origin, what: str) -> UnmodelledSettingError:
    return UnmodelledSettingError(f"{origin}: {key} = {shown(value)} is not budgeted: {what}. {MODELLED}; remove it "
                                  "to budget the run without it")


def memory_flags(claims: Claims, look: Lookup, framework: str = "transformers") -> list[Unmodelled]:
    """Read the settings above from ``look`` (a file's keys or a command's flags): say the ``loss`` they set, refuse
    what is not budgeted, and return what is listed as not modelled with its likely effect.  ``framework``:
    ``transformers`` (TrainingArguments, TRL), ``llamafactory`` or ``axolotl``."""
    for key, on, what in REFUSED:
        hit = look(key)
        if hit[0] and hit[1] is not None and on(hit[1]):
            raise refuse(key, hit[1], hit[2], what)
    for key in _OPTIM_KEYS:
        hit = look(key)
        if hit[0] and str(hit[1]).strip().lower() in OPTIM_IN_BACKWARD:
            raise refuse(key, hit[1], hit[2], OPTIM_IN_BACKWARD[str(hit[1]).strip().lower()]
                         + ": the optimizer steps each parameter inside backward and frees its gradient at once")
    for key in OFFLOAD_KEYS:
        hit = look(key)
        if hit[0]:  # a bare --activation_offloading is on
            claims.say("offload_activations", hit[1] is None or _on(hit[1]), hit[2])
    listed: list[Unmodelled] = []
    hit = look("torch_compile")
    if hit[0] and hit[1] is not None and _on(hit[1]):
        listed.append(Unmodelled(hit[2], hit[1], TORCH_COMPILE))
    if framework == "axolotl":
        listed += _axolotl_loss(claims, look)
    else:
        _liger(claims, look, framework)
    return listed


def _liger(claims: Claims, look: Lookup, framework: str) -> None:
    key = "enable_liger_kernel" if framework == "llamafactory" else "use_liger_kernel"
    hits = [look(k) for k in dict.fromkeys((key, "use_liger_kernel"))]
    hit = next((h for h in hits if h[0]), None)
    if hit is None or not (hit[1] is None or _on(hit[1])):  # a bare --use_liger_kernel is on
        if hit is not None:
            claims.say("loss", Loss.STANDARD, hit[2])
        return
    config = look("liger_kernel_config")
    if config[0] and isinstance(config[1], dict) and "fused_linear_cross_entropy" in config[1] \
            and not _on(config[1]["fused_linear_cross_entropy"]):
        claims.say("loss", Loss.STANDARD, config[2])
        return
    if framework == "llamafactory":
        stage = look("stage")
        name = str(stage[1]).strip().lower() if stage[0] and stage[1] is not None else "sft"
        if name not in LLAMAFACTORY_FUSED_STAGES:  # require_logits: Liger's plain cross-entropy, the logits kept
            claims.say("loss", Loss.STANDARD, stage[2])
            return
    claims.say("loss", Loss.LIGER_FLCE, hit[2])


def _plugins(look: Lookup) -> list[str]:
    hit = look("plugins")
    if not hit[0] or not hit[1]:
        return []
    return [str(p) for p in hit[1]] if isinstance(hit[1], list) else [str(hit[1])]


def _axolotl_loss(claims: Claims, look: Lookup) -> list[Unmodelled]:
    plugins, listed = _plugins(look), []
    for key, plugin, loss in (("cut_cross_entropy", CCE_PLUGIN, Loss.CCE),
                              ("liger_fused_linear_cross_entropy", LIGER_PLUGIN, Loss.LIGER_FLCE)):
        hit = look(key)
        if not (hit[0] and _on(hit[1])):
            continue
        if any(p.startswith(plugin) for p in plugins):
            claims.say("loss", loss, hit[2])
        else:
            listed.append(Unmodelled(hit[2], hit[1], f"axolotl applies it only with {plugin} listed under plugins "
                                     "(none here): the logits are budgeted"))
    return listed
