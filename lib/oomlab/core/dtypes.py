"""Floating-point storage types: canonical names, aliases and sizes in bits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.core.errors import UnknownNameError


@dataclass(frozen=True)
class DType:
    """A floating-point storage type: its canonical name, aliases and size in bits."""

    name: str  # canonical torch name, e.g. "float16"
    bits: int  # storage bits per element
    aliases: tuple[str, ...] = ()

    @property
    def itemsize(self) -> int:
        """Bytes per element (only for whole-byte dtypes)."""
        return self.bits // 8

    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.name)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float32", 32, ("fp32", "float", "torch.float32")),
        DType("float16", 16, ("fp16", "half", "torch.float16")),
        DType("bfloat16", 16, ("bf16", "torch.bfloat16")),
    )
}


def load_dtype(name: str) -> DType:
    """Look up a dtype by its name or alias (``fp16``, ``half``, ``torch.float16`` ...)."""
    key = str(name).strip().lower()
    for dtype in DTYPES.values():
        if key == dtype.name or key in dtype.aliases:
            return dtype
    known = [a for d in DTYPES.values() for a in (d.name, *d.aliases)]
    raise UnknownNameError("dtype", name, known)
