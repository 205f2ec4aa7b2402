"""What loading holds at the user's transformers release: the dtype from_pretrained loads in when nothing names one,
each GPU's peak while a bitsandbytes 4-bit base is quantized as it arrives, and each node's host RAM.

- **The load dtype** (:func:`default_load_dtype`): transformers 5 loads ``dtype='auto'`` -- the checkpoint's
  config.json ``torch_dtype`` (:attr:`~oomlab.core.versions.Fact.LOAD_DTYPE_AUTO`); 4.x without ``torch_dtype``
  builds and loads the model in float32, except under bitsandbytes, whose quantizer sets float16.
- **The 4-bit load** (:func:`quantized_load`): ``Params4bit.to`` quantizes a weight as it moves to the GPU
  (bitsandbytes 0.50.2 nn/modules.py:424-428 ``to`` -> ``_quantize``:381-395: ``w = self.data.contiguous().to(device)``
  then ``quantize_4bit``), and from_pretrained places tensor by tensor (a device_map, low_cpu_mem_usage forced for
  4-bit): the GPU holds the 4-bit weights placed so far, the unquantized ones in the load dtype, and one weight's
  load-dtype copy with its fp32 absmax while it is quantized -- the largest such weight is the transient.
- **Host RAM** (:func:`host_load`): per process, what from_pretrained leaves on the host (the model in the load dtype
  where no device_map places it on the GPU, a ``zero.Init`` partition under ZeRO-3) plus the checkpoint it reads: one
  shard where it streams (:attr:`~oomlab.core.versions.Fact.LOAD_STREAMS`, a device_map, a 4-bit base), else a
  full state dict of the shard beside a model built at full size; every process on a node loads its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.budget.analytic import loads_once_per_node
from oomlab.budget.states import (
    NF4_DQ_BITS,
    experts_quantized,
    nf4_state_fixed_bytes,
    quantized_parameters,
)
from oomlab.budget.workspace import NF4_BLOCK
from oomlab.core.choices import Precision
from oomlab.core.dtypes import load_dtype
from oomlab.core.models import ModelSpec
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import ceil_div, format_size
from oomlab.core.versions import Fact, Versions, applies
from oomlab.launch.origin import Sourced, assumed, default_origin
from oomlab.launch.paths import LoadPath
from oomlab.launch.read import dtype_name

# NB: an assumption, not read from the checkpoint: the shard size of the Hub's 4.x-era checkpoints (Llama-2-13b-hf:
# three .bin shards of at most 9.95 GB, save_pretrained's max_shard_size "10GB" then; 5.24 writes "50GB",
# modeling_utils.py:3325); a checkpoint smaller than this is one shard
SHARD_BYTES = 10 * 10**9
_BNB_FP16 = ("the bitsandbytes quantizer sets float16 where torch_dtype is None (4.x quantizers/quantizer_bnb_4bit.py "
             "update_torch_dtype: 'Overriding torch_dtype=None with torch_dtype=torch.float16')")


def transformers_label(versions: Versions) -> str:
    release = versions.release("transformers")
    if release is None:
        return "transformers (newest)"
    origin = versions.origin("transformers")
    return f"transformers {'.'.join(map(str, release))}" + (f" ({origin.value})" if origin is not None else "")


def config_dtype(spec: ModelSpec) -> str | None:
    """The checkpoint's ``torch_dtype`` (or 5.x ``dtype``) as its config.json states it, or None."""
    raw = (spec.config.get("torch_dtype") or spec.config.get("dtype")) if spec.config else None
    return None if raw in (None, "auto") else str(raw)


def default_load_dtype(spec: ModelSpec, precision: Precision, versions: Versions, quantized: bool) -> Sourced:
    """The dtype from_pretrained loads in when neither the launch nor a framework names ``torch_dtype``, its origin
    naming the transformers release and the line that decides it."""
    label = transformers_label(versions)
    stated = config_dtype(spec)
    if applies(Fact.LOAD_DTYPE_AUTO, versions):
        if stated is not None:
            origin = default_origin(label, f"from_pretrained dtype='auto' (modeling_utils.py:4186-4187 in 5.24): the "
                                    f"checkpoint's {stated} ({spec.source})")
            return Sourced(dtype_name(stated, origin), origin)
        return Sourced(precision.compute_dtype, assumed(
            f"no torch_dtype in the launch or the model's config.json: {label} loads dtype='auto', the checkpoint's "
            f"weights' dtype (not known here), taken as the dtype {precision.value} computes in"))
    if quantized:
        return Sourced("float16", default_origin(label, _BNB_FP16))
    ignored = f"; the config's {stated} is not read before transformers 5.0" if stated else ""
    why = (f"from_pretrained without torch_dtype loads torch.float (fp32): 4.x modeling_utils.py (4.40.1 :3490) "
           f"sets a dtype only under 'if torch_dtype is not None:'{ignored} ({Fact.LOAD_DTYPE_AUTO.value}: 5.0.0 "
           "changed it)")
    return Sourced("float32", default_origin(label, why))


@dataclass(frozen=True)
class QuantizedLoad:
    """One GPU's peak while a bitsandbytes 4-bit base loads onto it."""

    quantized_bytes: int  # the 4-bit weights (NF4 with double-quantized absmax) and their quantization states
    unquantized_bytes: int  # embedding, norms, LM head (and 3-D experts) in the load dtype
    transient_bytes: int  # the largest quantized weight's load-dtype copy on the GPU plus its fp32 absmax
    outside_bytes: int  # CUDA context and the like, outside PyTorch

    @property
    def total_bytes(self) -> int:
        return self.quantized_bytes + self.unquantized_bytes + self.transient_bytes + self.outside_bytes

    def text(self, dtype: str) -> str:
        return (f"{format_size(self.quantized_bytes)} of 4-bit weights, {format_size(self.unquantized_bytes)} "
                f"unquantized in {dtype}, and {format_size(self.transient_bytes)} while the largest weight is "
                f"quantized (its {dtype} copy on the GPU, bitsandbytes Params4bit._quantize)")


def largest_quantized_weight(setup: TrainingSetup) -> int:
    """Elements of the largest weight bitsandbytes quantizes: a projection, or one expert's matrix where the
    experts are nn.Linear (4.x Mixtral-style)."""
    spec = setup.model
    largest = max(n_in * n_out for n_in, n_out in spec.projection_shapes.values())
    if experts_quantized(setup):
        for layout in spec.layer_layouts:
            if layout.experts:
                largest = max(largest, layout.expert_params // (3 * layout.experts))
    return largest


def quantized_load(setup: TrainingSetup, dtype: str, outside_bytes: int) -> QuantizedLoad:
    """The load peak of a 4-bit base on one GPU, its weights arriving in ``dtype``."""
    size = load_dtype(dtype).itemsize
    quantized = quantized_parameters(setup)
    packed = round(quantized * NF4_DQ_BITS / 8) + nf4_state_fixed_bytes(setup)
    largest = largest_quantized_weight(setup)
    transient = size * largest + 4 * ceil_div(largest, NF4_BLOCK)
    return QuantizedLoad(packed, size * (setup.model.num_parameters - quantized), transient, outside_bytes)


@dataclass(frozen=True)
class HostLoad:
    """One node's host RAM while every process on it loads the model."""

    per_process_bytes: int
    processes: int  # processes per node that each load
    detail: str

    @property
    def per_node_bytes(self) -> int:
        return self.per_process_bytes * self.processes


_ON_GPU = (LoadPath.QUANTIZED, LoadPath.DEVICE_MAP)


def host_load(setup: TrainingSetup, path: LoadPath, dtype: str) -> HostLoad:
    """Host RAM per node at load: each process's model copy on the host (none where a device_map places each tensor
    on the GPU; a 1/world partition under ``zero.Init``) plus the checkpoint it holds while reading -- one shard
    tensor where from_pretrained streams, else a full state dict of a shard (in the checkpoint's dtype) beside a
    full-size model built first.
    FSDP loads once per node where the step's budget says so (:func:`oomlab.budget.analytic.loads_once_per_node`:
    cpu_ram_efficient_loading, not for a 4-bit base).  Beside the step's host figure (each loading process's replica
    in the step's weight dtype) this one is the load's own: the load dtype and the checkpoint being read."""
    spec = setup.model
    n = spec.num_parameters
    size = load_dtype(dtype).itemsize
    stated = config_dtype(spec)
    checkpoint = n * (load_dtype(stated).itemsize if stated else size)
    shard = min(checkpoint, SHARD_BYTES)
    streams = applies(Fact.LOAD_STREAMS, setup.versions) or path in _ON_GPU
    label = transformers_label(setup.versions)
    if path is LoadPath.TORCHTUNE_BUILD:  # FullModelHFCheckpointer merges every file's tensors into one CPU dict
        processes = setup.gpus
        detail = (f"{format_size(checkpoint)} per process (torchtune's checkpointer holds the whole checkpoint on the "
                  f"host: training/checkpointing/_checkpointer.py :508-528 at v0.6.1, safetensors read into memory) "
                  f"× {processes} process{'es' if processes > 1 else ''} per node")
        return HostLoad(checkpoint, processes, detail)
    if path in _ON_GPU:
        model, what = 0, "each tensor placed on the GPU as read"
    elif path is LoadPath.ZERO_INIT:
        model, what = ceil_div(n, setup.world_size) * size, f"a 1/{setup.world_size} zero.Init partition in {dtype}"
    else:
        model, what = n * size, f"the model in {dtype} on the host until it is moved"
    if streams:  # safetensors read tensor by tensor: the largest tensor's bytes in flight
        tensor = max(spec.embedding_params, spec.lm_head_params, largest_quantized_weight(setup))
        held, read = tensor * size, "one tensor read at a time"
    else:
        held, read = shard, "a full state dict of each shard beside a model built at full size"
    per_process = model + held
    processes = 1 if setup.world_size == 1 or loads_once_per_node(setup) else setup.gpus
    detail = (f"{format_size(per_process)} per process ({what}, plus {format_size(held)} of checkpoint: {read}, "
              f"{label}) × {processes} process{'es' if processes > 1 else ''} per node")
    return HostLoad(per_process, processes, detail)
