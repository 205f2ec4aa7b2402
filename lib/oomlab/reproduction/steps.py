"""What one step of ``Module._apply``'s walk records: the tensor copied to the device and the allocator after it
(shared by the torch-free walk, :mod:`oomlab.reproduction.apply_walk`, and the traced one,
:mod:`oomlab.reproduction.traced_walk`)."""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.core.choices import Choice

UNLIMITED_BYTES = 1 << 62  # capacity of the "how much would it take" walk


class TensorKind(Choice):
    """What a tensor moved by ``Module._apply`` is to its module."""

    PARAMETER = "parameter"  # from named_parameters: trained (or frozen) weights
    BUFFER = "buffer"  # from named_buffers: e.g. rotary inv_freq, causal masks
    TENSOR = "tensor"  # neither: moved by ``.to()`` but registered under no name


@dataclass(frozen=True)
class WalkStep:
    """One tensor copied to the device during ``Module._apply``, and the allocator after it."""

    index: int  # position in the walk (0-based)
    name: str  # qualified name, e.g. "model.layers.23.mlp.gate_proj.weight"
    kind: TensorKind
    shape: tuple[int, ...]
    dtype: str  # e.g. "float16"
    nbytes: int  # the tensor's bytes
    tried_bytes: int  # the segment the allocator would ask cudaMalloc for, if it needed a new one
    allocated_bytes: int  # allocator's allocated bytes after this copy
    reserved_bytes: int  # allocator's reserved bytes after this copy
    moved_bytes: int  # tensor bytes moved so far, this one included
    moved_parameters: int  # parameter elements moved so far, this one included
