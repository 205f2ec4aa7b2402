"""Build full-size models with transformers without weights: on the ``meta`` device, no hub access."""

from __future__ import annotations

import os
from typing import Any

from oomlab.specs import DType, ModelSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_meta_model(spec: ModelSpec, dtype: DType) -> Any:
    """The ``AutoModelForCausalLM`` of ``spec`` with every parameter on ``meta`` in ``dtype``.

    Buffers keep the dtype transformers gives them (RoPE ``inv_freq`` stays float32).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(spec.hf_config(), dtype=dtype.torch_dtype())
    finally:
        hf_logging.set_verbosity(verbosity)


def tensor_nbytes(t: Any) -> int:
    """Bytes a tensor's data occupies (``numel * element_size``)."""
    return int(t.numel()) * int(t.element_size())
