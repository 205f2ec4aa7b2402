"""Each FSDP strategy's model prepared the way its launcher prepares it, for the traced and measured steps.

- :func:`shard_fsdp1`: ``accelerate launch`` with an FSDP1 config, as ``Accelerator.prepare_model`` builds it
  (accelerate/accelerator.py 1919-2038): the plugin accelerate's own ``FullyShardedDataParallelPlugin`` makes of the
  settings oomlab's launch file writes (FULL_SHARD, transformer auto-wrap of the decoder layer, BACKWARD_PRE,
  ``use_orig_params``, ``limit_all_gathers``, ``MixedPrecision(param, reduce, buffer = half)``), ``FSDP(model,
  **kwargs)``, then every trainable flat parameter upcast to fp32 (accelerator.py 1998-2038).  With LoRA the wrap
  policy is peft's ``fsdp_auto_wrap_policy`` (adapters wrapped apart, as the Trainer does: transformers
  distributed/fsdp.py ``update_fsdp_plugin_peft``) -- FSDP1 cannot flatten a fp32 adapter with a half base.
- :func:`shard_fsdp2`: accelerate's own ``fsdp2_prepare_model`` (accelerate/utils/fsdp_utils.py 751-918) on the
  plugin for ``fsdp_version: 2``: trainable parameters upcast to fp32, ``fully_shard`` per decoder layer, the input
  embedding, a ``[final norm, lm_head]`` group not resharded after forward, and the root.

Both run over whatever default process group exists (a fake one for traces, gloo for real small-scale runs).
NB: ``sync_module_states`` / ``cpu_ram_efficient_loading`` (what oomlab's launch files set) change only how the
weights are loaded, not the step; they are left out here (on CPU accelerate refuses them: no accelerator device).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from oomlab.core.choices import FSDP1_STRATEGIES, Method, Precision
from oomlab.core.setup import TrainingSetup

ACCELERATE_MIXED_PRECISION = {Precision.FP16_MIXED: "fp16", Precision.BF16_MIXED: "bf16"}


def decoder_layer_class(model: Any) -> str:
    """The class name of the model's decoder layer (what FSDP wraps): the first ``_no_split_modules`` entry."""
    base = getattr(model, "base_model", model)
    inner = getattr(base, "model", base)
    names = list(getattr(inner, "_no_split_modules", None) or getattr(model, "_no_split_modules", None) or [])
    if names:
        return names[0]
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            return type(module).__name__
    raise ValueError(f"cannot find the decoder layer class of {type(model).__name__}")


def fsdp_plugin(setup: TrainingSetup, model: Any) -> Any:
    """accelerate's ``FullyShardedDataParallelPlugin`` for the setup, as oomlab's launch file configures it."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    version = 1 if setup.strategy in FSDP1_STRATEGIES else 2
    kwargs: dict[str, Any] = {
        "fsdp_version": version, "auto_wrap_policy": "transformer_based_wrap",
        "transformer_cls_names_to_wrap": [decoder_layer_class(model)], "cpu_offload": setup.strategy.offloads,
        "reshard_after_forward": "FULL_SHARD" if version == 1 else True, "limit_all_gathers": True,
    }
    if version == 1:
        kwargs.update(backward_prefetch="BACKWARD_PRE", forward_prefetch=False, use_orig_params=True)
    plugin = FullyShardedDataParallelPlugin(**kwargs)
    mixed = ACCELERATE_MIXED_PRECISION.get(setup.precision)
    if mixed is not None:
        plugin.set_mixed_precision(mixed)
    return plugin


def shard_fsdp1(model: Any, setup: TrainingSetup) -> Any:
    """``model`` wrapped in FSDP1 as ``Accelerator.prepare_model`` does; call inside the trace's fake mode."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    plugin = fsdp_plugin(setup, model)
    plugin.set_auto_wrap_policy(model)
    if setup.method is not Method.FULL:
        from peft.utils.other import fsdp_auto_wrap_policy

        plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)
    cpu = torch.device("cpu")
    wrapped = FSDP(model, sharding_strategy=plugin.sharding_strategy or plugin.reshard_after_forward,
                   cpu_offload=plugin.cpu_offload, auto_wrap_policy=plugin.auto_wrap_policy,
                   mixed_precision=plugin.mixed_precision_policy, backward_prefetch=plugin.backward_prefetch,
                   forward_prefetch=plugin.forward_prefetch, use_orig_params=plugin.use_orig_params,
                   limit_all_gathers=plugin.limit_all_gathers, device_id=cpu,
                   param_init_fn=lambda module: module.to_empty(device=cpu, recurse=False))
    if setup.precision in ACCELERATE_MIXED_PRECISION:  # accelerator.py 1998-2038
        for module in FSDP.fsdp_modules(wrapped):
            if not module._has_params:
                continue
            param = module._flat_param
            if param.dtype != torch.float32 and param.requires_grad:
                param.data = param.data.to(torch.float32)
                module._handle._orig_param_dtype = torch.float32
    return wrapped


def fsdp1_buffers(model: Any) -> Any:
    """A callable listing FSDP1's own tensors and what oomlab calls them: gathered half parameters are workspace
    ("unsharded_param"), the sharded gradient of each flat parameter a gradient (FSDP1 assigns it outside autograd's
    hooks).  The units are found once (the tracker asks on every operation)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    flats = [module._flat_param for module in FSDP.fsdp_modules(model) if module._has_params]
    return lambda: _fsdp1_tensors(flats)


def _fsdp1_tensors(flats: list[Any]) -> list[tuple[Any, str]]:
    found: list[tuple[Any, str]] = []
    for flat in flats:
        for name in ("_full_param_padded", "_mp_shard", "_full_prec_full_param_padded"):
            buffer = getattr(flat, name, None)
            if buffer is not None and buffer.untyped_storage().size():
                found.append((buffer, "unsharded_param"))
        for grad in (flat.grad, getattr(flat, "_saved_grad_shard", None)):  # the shard kept until the step
            if grad is not None:
                found.append((grad, "gradient"))
    return found


def shard_fsdp2(model: Any, setup: TrainingSetup) -> Any:
    """``model`` sharded by accelerate's own ``fsdp2_prepare_model`` (on a stand-in for the Accelerator)."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=fsdp_plugin(setup, model)), is_main_process=False, torch_device_mesh=None,
        mixed_precision=ACCELERATE_MIXED_PRECISION.get(setup.precision, "no"),
    )
    return fsdp2_prepare_model(accelerator, model)
