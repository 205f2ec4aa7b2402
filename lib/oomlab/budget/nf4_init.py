"""torchtune < 0.2.0's QLoRA init on torchao 0.1: the load peak, and the cache it leaves reserved.

torchtune v0.1.0 and v0.1.1 pin ``torchao==0.1`` (:data:`~oomlab.core.versions.FRAMEWORK_PINS`), whose ``to_nf4``
finds the nearest NF4 code over the whole weight at once -- ``(value.unsqueeze(-1) - nf4).abs()`` holds two
(elements x 16) bf16 tensors (:attr:`~oomlab.core.versions.Fact.TORCHAO_CHUNKED_NF4`; chunked from torchao 0.2.0).
Its QLoRA recipe quantizes every base weight three times on the GPU, in this order (torchtune v0.1.0):

1. ``qlora_llama2_7b`` builds the model under the GPU device and bf16 (``recipes/lora_finetune_single_device.py``
   ``_setup_model``): one decoder layer first -- each adapted projection is an ``nn.Linear`` in bf16 handed to
   ``to_nf4`` (``torchtune/modules/peft/lora.py`` ``_create_weight_and_bias``), the bf16 weight freed when that
   returns, then its ``lora_a``/``lora_b`` -- then the embedding and the (never quantized) output projection
   (``torchtune/models/llama2/_component_builders.py`` :233-238);
2. ``TransformerDecoder`` clones that layer ``num_layers`` times with ``copy.deepcopy``
   (``torchtune/modules/transformer.py`` :137 ``_get_clones``), and torchtune's NF4 ``clone`` is
   ``to_nf4(get_original_weight())`` -- dequantize, quantize again (``torchtune/utils/_register_nf4_dispatch_ops.py``
   :11-19); the prototype layer is freed when the builder returns;
3. ``model.load_state_dict`` copies each checkpoint weight in: NF4's ``copy_`` is ``to_nf4(src.to(device))`` and
   then swaps the new pieces in (the same file :22-44), the old ones freed.

:func:`torchao_init` replays that order -- each ``to_nf4`` and ``get_original_weight`` as recorded from torchao 0.1's
own code (``lib/oomlab/data/torchao-nf4-events.json``, :mod:`oomlab.evidence.nf4_events`) -- through oomlab's model
of the caching allocator on the setup's GPU (its memory outside PyTorch taken first), and returns the init's
allocated peak, the reserved bytes it leaves cached (what ``torch.cuda.max_memory_reserved`` reads after init, and
through training on a GPU that never has to release them), and whether the init runs out of memory even after the
allocator releases its cache.  NB: the events were recorded on CPU; the same aten ops are assumed to allocate the
same outputs on CUDA.  Small buffers (norms' weights, RoPE caches) are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from oomlab.budget.result import LoadPeak
from oomlab.core.choices import Method
from oomlab.core.models import ModelSpec
from oomlab.core.paths import DATA_DIR
from oomlab.core.setup import TORCHTUNE_CHUNKING, TrainingSetup
from oomlab.core.units import format_size
from oomlab.core.versions import Fact, applies
from oomlab.reproduction.allocator import CachingAllocator, SimulatedOutOfMemory

__all__ = ["NF4_EVENTS_JSON", "runs_torchao_unchunked", "torchao_init"]

NF4_EVENTS_JSON = DATA_DIR / "torchao-nf4-events.json"
# torchtune v0.1.0 _component_builders.py lora_llama2_mlp: gate_proj, down_proj, up_proj built in this order, and
# FeedForward registers them as w1, w2, w3 (the order load_state_dict copies in)
TORCHTUNE_MLP_ORDER = ("gate_proj", "down_proj", "up_proj")
RESOLUTION = 2 * 1024**2  # bytes: the least GPU the init runs on is found to the allocator's small segment size
HALF = 2  # bytes of a bf16 element: torchtune builds and loads the model in its dtype (bf16)


@dataclass(frozen=True)
class _Events:
    unit: int
    to_nf4: tuple[tuple, ...]
    dequantize: tuple[tuple, ...]


@lru_cache(maxsize=1)
def _events() -> _Events:
    data = json.loads(NF4_EVENTS_JSON.read_text())
    seq = data["sequences"]
    return _Events(int(data["unit_elements"]), tuple(map(tuple, seq["to_nf4"])),
                   tuple(map(tuple, seq["get_original_weight"])))


def runs_torchao_unchunked(setup: TrainingSetup) -> bool:
    """QLoRA under torchtune < 0.2.0 (the init order replayed here) on torchao before 0.2.0 (its pin: 0.1)."""
    return (setup.method is Method.QLORA and setup.versions.framework == "torchtune"
            and (setup.versions.release("torchtune") or (0,)) < TORCHTUNE_CHUNKING
            and not applies(Fact.TORCHAO_CHUNKED_NF4, setup.versions))


class _Replay:
    """The init's tensors through one :class:`CachingAllocator`."""

    def __init__(self, allocator: CachingAllocator) -> None:
        self.allocator = allocator
        self.events = _events()

    def malloc(self, size: int) -> int:
        return self.allocator.malloc(size)

    def free(self, handles: object) -> None:
        for handle in handles if isinstance(handles, (list, tuple)) else (handles,):
            self.allocator.free(handle)

    def run(self, events: tuple[tuple, ...], elements: int) -> list[int]:
        """One recorded call on a weight of ``elements``: returns the handles it keeps (its result)."""
        live: dict[int, int] = {}
        for event in events:
            if event[0] == "alloc":
                live[event[1]] = self.malloc(event[2] + event[3] * elements // self.events.unit)
            else:
                self.free(live.pop(event[1]))
        return list(live.values())

    def quantize(self, elements: int) -> list[int]:
        return self.run(self.events.to_nf4, elements)

    def dequantize(self, elements: int) -> list[int]:
        return self.run(self.events.dequantize, elements)


def _layer(spec: ModelSpec, targets: tuple[str, ...]) -> tuple[tuple[int, int, bool], ...]:
    """``(in, out, quantized)`` of each projection of the (most common) layer, in torchtune's order: torchtune 0.1
    quantizes the adapted ones (``LoRALinear(quantize_base=True)``); the others stay ``nn.Linear`` in bf16."""
    chosen = set(targets)
    names = list(spec.layer.projections)
    mlp = [i for i, name in enumerate(names) if name in TORCHTUNE_MLP_ORDER]
    for i, name in zip(mlp, sorted((names[i] for i in mlp), key=TORCHTUNE_MLP_ORDER.index), strict=True):
        names[i] = name  # torchtune builds (and registers, so loads) w1, w2, w3: gate, down, up
    return tuple((spec.layer.projections[name].in_features, spec.layer.projections[name].out_features,
                  name.rsplit(".", 1)[-1] in chosen) for name in names)


def _replay(spec: ModelSpec, shapes: tuple[tuple[int, int, bool], ...], rank: int,
            allocator: CachingAllocator) -> None:
    r = _Replay(allocator)

    def build(prototype: list | None) -> list:
        held: list = []
        for index, (fan_in, fan_out, quantized) in enumerate(shapes):
            n = fan_in * fan_out
            if not quantized:
                held.append(r.malloc(HALF * n))
                continue
            if prototype is None:  # nn.Linear in bf16, quantized, freed; then the adapters
                weight = r.malloc(HALF * n)
                pieces = r.quantize(n)
                r.free(weight)
            else:  # deepcopy: NF4 clone = to_nf4(get_original_weight())
                restored = r.dequantize(n)
                pieces = r.quantize(n)
                r.free(restored)
            held.append((pieces, r.malloc(HALF * rank * fan_in), r.malloc(HALF * rank * fan_out), index))
        return held

    prototype = build(None)
    r.malloc(HALF * spec.embedding_params)  # the embedding, then the output projection: never quantized (:233-238)
    if spec.lm_head_params:  # none where the head is the embedding's (tied)
        r.malloc(HALF * spec.lm_head_params)
    layers = [build(prototype) for _ in range(spec.num_hidden_layers)]
    for item in prototype:
        r.free(item[0] + [item[1], item[2]] if isinstance(item, tuple) else item)
    for layer in layers:  # load_state_dict: NF4 copy_ = to_nf4(src.to(device)), the old pieces swapped out
        for position, item in enumerate(layer):
            if not isinstance(item, tuple):
                continue
            pieces, lora_a, lora_b, index = item
            fan_in, fan_out, _ = shapes[index]
            arrived = r.malloc(HALF * fan_in * fan_out)
            fresh = r.quantize(fan_in * fan_out)
            r.free(arrived)
            r.free(pieces)
            layer[position] = (fresh, lora_a, lora_b, index)
    # the embedding and the head stay held by the model through training


@dataclass(frozen=True)
class _Run:
    allocated_peak: int
    reserved_peak: int
    reserved_after: int
    short: int | None  # bytes short where the init ran out of memory, else None


@lru_cache(maxsize=256)
def _run(spec: ModelSpec, targets: tuple[str, ...], rank: int, capacity: int, outside: int) -> _Run:
    """The init replayed on a GPU of ``capacity`` bytes with ``outside`` of them held outside PyTorch."""
    allocator = CachingAllocator(capacity, min(outside, capacity))
    try:
        _replay(spec, _layer(spec, targets), rank, allocator)
    except SimulatedOutOfMemory as oom:
        stats, snap = allocator.stats(), oom.snapshot
        return _Run(stats.peak_allocated_bytes, stats.peak_reserved_bytes, snap.reserved_bytes,
                    snap.tried_bytes - snap.free_bytes)
    stats = allocator.stats()
    return _Run(stats.peak_allocated_bytes, stats.peak_reserved_bytes, stats.reserved_bytes, None)


@lru_cache(maxsize=64)
def _least_capacity(spec: ModelSpec, targets: tuple[str, ...], rank: int, outside: int) -> int:
    """The smallest GPU (to :data:`RESOLUTION`) the init runs on: its allocated peak and the fragmentation the
    allocator cannot release (it frees its cache and retries before it gives up), plus ``outside``."""
    roomy = _run(spec, targets, rank, 1 << 50, 0)
    low, high = roomy.allocated_peak + outside, roomy.reserved_peak + outside + RESOLUTION
    while high - low > RESOLUTION:
        middle = (low + high) // 2
        if _run(spec, targets, rank, middle, outside).short is None:
            high = middle
        else:
            low = middle
    return high


def torchao_init(setup: TrainingSetup, outside_bytes: int) -> LoadPeak | None:
    """The init's :class:`LoadPeak` where the setup runs torchtune < 0.2.0's QLoRA (torchao 0.1), else None: its
    allocated peak (the GPU's size does not change it), the least GPU it runs on, and what it leaves reserved on
    this one (where it runs out of memory: what was reserved when it did)."""
    if not runs_torchao_unchunked(setup):
        return None
    spec, targets, rank, capacity = setup.model, tuple(setup.lora_targets), setup.lora_rank, \
        setup.gpu.total_memory_bytes
    allocated = _run(spec, targets, rank, 1 << 50, 0).allocated_peak
    here = _run(spec, targets, rank, capacity, outside_bytes)
    need = _least_capacity(spec, targets, rank, outside_bytes)
    release = ".".join(map(str, setup.versions.release("torchao") or ()))
    what = (f"loading: torchtune's QLoRA init on torchao {release} quantizes each weight unchunked, three times "
            f"(built, cloned per layer, loaded): {format_size(allocated)} allocated at its peak, so it needs "
            f"a GPU of {format_size(need)} or more (outside PyTorch and the allocator's fragmentation included)"
            + (f" -- out of memory while loading on this GPU, {format_size(need - capacity)} short"
               if here.short is not None else
               f"; {format_size(here.reserved_after)} reserved after it on this GPU (cached: the step reuses it)")
            + f" ({Fact.TORCHAO_CHUNKED_NF4.value}: replayed from torchao 0.1's recorded allocations; torchao >= "
            "0.2.0, torchtune >= 0.2.0, quantizes in chunks)")
    return LoadPeak(allocated_peak_bytes=allocated, reserved_bytes=here.reserved_after, need_bytes=need, what=what)
