"""Tests for oomlab.core.dtypes: each dtype's size is torch's own, and every alias finds it."""

from __future__ import annotations

import pytest
import torch

from oomlab.core.dtypes import DTYPES, load_dtype
from oomlab.core.errors import UnknownNameError


@pytest.mark.parametrize("name", list(DTYPES))
def test_bits_are_torchs(name: str) -> None:
    """bits and itemsize agree with torch's element size (a wrong table entry would shift every reproduced figure)."""
    dtype = DTYPES[name]
    assert dtype.torch_dtype() is getattr(torch, name)
    assert dtype.bits == 8 * torch.empty((), dtype=dtype.torch_dtype()).element_size()
    assert dtype.itemsize == dtype.torch_dtype().itemsize


@pytest.mark.parametrize(("alias", "name", "bits"), [("fp16", "float16", 16), ("half", "float16", 16),
                                                     ("bf16", "bfloat16", 16), ("torch.bfloat16", "bfloat16", 16),
                                                     ("FP32", "float32", 32), (" float ", "float32", 32)])
def test_aliases(alias: str, name: str, bits: int) -> None:
    assert (load_dtype(alias).name, load_dtype(alias).bits) == (name, bits)


def test_unknown_dtype_lists_the_known() -> None:
    with pytest.raises(UnknownNameError, match="unknown dtype .fp8.; known: bf16, bfloat16, float, float16, float32"):
        load_dtype("fp8")
