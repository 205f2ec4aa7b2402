"""Build full-size models with transformers without weights: on the ``meta`` device, no hub access."""

from __future__ import annotations

import os
from typing import Any

from oomlab.core.dtypes import DType
from oomlab.core.models import ModelSpec
from oomlab.core.quiet import quiet_libraries

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_meta_model(spec: ModelSpec, dtype: DType) -> Any:
    """The ``AutoModelForCausalLM`` of ``spec`` with every parameter on ``meta`` in ``dtype``.

    Buffers keep the dtype transformers gives them (RoPE ``inv_freq`` stays float32).
    """
    import torch
    from transformers import AutoModelForCausalLM

    with quiet_libraries(), torch.device("meta"):
        return AutoModelForCausalLM.from_config(spec.hf_config(), dtype=dtype.torch_dtype())


def tensor_nbytes(t: Any) -> int:
    """Bytes a tensor's data occupies (``numel * element_size``)."""
    return int(t.numel()) * int(t.element_size())


def unique_tensors(model: Any) -> list[Any]:
    """Parameters and buffers of ``model``, each tensor once (tied weights count once)."""
    seen: dict[int, Any] = {}
    for _, t in list(model.named_parameters()) + list(model.named_buffers()):
        seen.setdefault(id(t), t)
    return list(seen.values())
