"""The one-layer inventory: what each decoder layer of any family saves for backward, traced at full width on the
model's first layers and scaled to the whole model -- the activations of :mod:`oomlab.budget.activations` for every
architecture without a hand-derived inventory.

How (:func:`trace_layers`):

1. Cut the model to its shortest prefix that holds one layer of every kind after the first (2 layers for uniform
   models, 3 for Gemma-2's alternating sliding and global layers): the first layer differs under LoRA (its input, the
   frozen embedding's output, needs no gradient), later layers by kind.
2. Run one forward with the loss on fake tensors (``FakeTensorMode``: shapes, dtypes and storages, no data), the
   launch's dtypes applied as :mod:`oomlab.budget.step` builds them, and account every storage autograd saves
   (``torch.autograd.graph.saved_tensors_hooks``; parameters and scalars excluded, each storage once) to the decoder
   layer it is saved in, to "shared" when it is an input every layer receives (RoPE's cos and sin, an attention
   mask), or to "outside" (embedding, final norm, LM head, loss).
3. Do it at six sizes -- batch 2 and 4 by sequence ``s0``, ``2 s0`` and ``3 s0`` -- and solve, storage by storage, for
   its bytes as ``c0 + c1 b + c2 s + c3 b s + c4 s^2 + c5 b s^2`` (exactly: the six sizes make the system invertible):
   linear in tokens for most, quadratic in the sequence for eager attention's probabilities or a materialised mask,
   affine where a tensor is ``s + 1`` long (the loss's padded labels), constant for autocast's weight copies. At
   batch 1 a reshape can return a view where a larger batch copies (Falcon's attention), so a micro-batch of 1 is
   traced apart, at batch 1 and three lengths. Every size stays on the setup's side of a sliding window (a mask is
   materialised from ``seq >= window`` on): the band of the setup's ``seq`` is part of the key. Storages that differ
   between the sizes are refused (the scaling would be a guess).

A trace takes about a second; it is memoised per (config, dtypes, LoRA, attention, band) and cached on disk beside the
step traces. :func:`whole_model_saved` does the same accounting over the whole model at one size: the check that one
layer + scaling equals it (tests/budget/test_layer_trace.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from oomlab.budget.step import StepDTypes, build_model, library_versions, real_data_decisions, to_empty_tied
from oomlab.core import paths
from oomlab.core.errors import InvalidValueError
from oomlab.core.files import write_json_atomic
from oomlab.core.memo import BoundedMemo
from oomlab.core.models import ModelSpec, model_from_config
from oomlab.core.quiet import quiet_libraries
from oomlab.core.setup import make_setup

LAYER_TRACE_VERSION = 4  # bump when what a layer trace records changes; part of the cache key
BASE_SEQ = 32  # s0: the probes run s0, 2 s0 and 3 s0 tokens per sequence
BATCHES = (2, 4)  # and these micro-batches (or 1 alone, for a micro-batch of 1)
TERMS = ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))  # (batch power, sequence power) of each fitted term
FIRST, LATER, SHARED, OUTSIDE = "first layer", "later layers", "shared by the layers", "outside the layers"


@dataclass(frozen=True)
class Polynomial:
    """Bytes as a sum of ``c * batch^i * seq^j`` terms (``(i, j, c)``)."""

    terms: tuple[tuple[int, int, float], ...] = ()

    def at(self, batch: int, seq: int, *, fixed: bool = True) -> int:
        """Bytes at ``batch x seq``; ``fixed=False`` leaves out the constant term (autocast's weight copies)."""
        return round(sum(c * batch**i * seq**j for i, j, c in self.terms if fixed or i or j))

    @property
    def fixed(self) -> int:
        return round(sum(c for i, j, c in self.terms if not i and not j))

    def __add__(self, other: Polynomial) -> Polynomial:
        summed: dict[tuple[int, int], float] = {}
        for i, j, c in (*self.terms, *other.terms):
            summed[(i, j)] = summed.get((i, j), 0.0) + c
        return Polynomial(tuple((i, j, c) for (i, j), c in sorted(summed.items())))


@dataclass(frozen=True)
class LayerTrace:
    """Saved-for-backward bytes of a model's parts as polynomials in micro-batch and sequence length."""

    first: Polynomial  # decoder layer 0
    layers: tuple[Polynomial, ...]  # one per kind of the later layers (the prefix's layers 1, 2, ...)
    kinds: tuple[int, ...]  # for each layer 1 .. L-1 of the model, its entry in ``layers``
    shared: Polynomial  # inputs every layer saves (RoPE cos/sin, masks): counted once
    outside: Polynomial  # embedding, final norm, LM head, loss
    stream_bytes: int  # bytes per element of the residual stream between layers
    probe_layers: int  # how many layers the prefix had
    seconds: float  # wall time of the two probes

    def later_layers(self, batch: int, seq: int, *, fixed: bool = False) -> int:
        """Layers 1 .. L-1 together (token-scaled bytes, or only the constant ones with ``fixed``)."""
        values = [p.fixed if fixed else p.at(batch, seq, fixed=False) for p in self.layers]
        return sum(values[k] for k in self.kinds)

    def mean_layer(self, batch: int, seq: int, *, fixed: bool = False) -> int:
        """One later layer's bytes, the mean over kinds weighted by their count (every layer, in uniform models).

        NB: Gemma-2's sliding and global layers differ only past the window; the mean is what sums need.
        """
        if not self.kinds:  # a one-layer model: its "later" layer is the prefix's second
            return self.layers[0].fixed if fixed else self.layers[0].at(batch, seq, fixed=False)
        return self.later_layers(batch, seq, fixed=fixed) // len(self.kinds)

    def to_json(self) -> dict[str, Any]:
        def poly(p: Polynomial) -> list[list[float]]:
            return [[i, j, c] for i, j, c in p.terms]

        return {"first": poly(self.first), "layers": [poly(p) for p in self.layers], "kinds": list(self.kinds),
                "shared": poly(self.shared), "outside": poly(self.outside), "stream_bytes": self.stream_bytes,
                "probe_layers": self.probe_layers, "seconds": self.seconds}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LayerTrace:
        def poly(terms: list[list[float]]) -> Polynomial:
            return Polynomial(tuple((int(i), int(j), float(c)) for i, j, c in terms))

        return cls(poly(raw["first"]), tuple(poly(p) for p in raw["layers"]), tuple(int(k) for k in raw["kinds"]),
                   poly(raw["shared"]), poly(raw["outside"]), int(raw["stream_bytes"]), int(raw["probe_layers"]),
                   float(raw["seconds"]))


@dataclass(frozen=True)
class Probe:
    """What a layer trace depends on besides the model: the launch's dtypes, LoRA and attention."""

    dtypes: StepDTypes  # storage / autocast / adapter dtypes (the regime, as step.py builds it)
    lora_rank: int  # 0: full fine-tuning
    lora_targets: tuple[str, ...]
    attention: str  # "sdpa" or "eager"
    beyond_window: bool  # seq >= the sliding window: masks are materialised
    single_batch: bool  # a micro-batch of 1 (some reshapes are views only then)


# ----------------------------------------------------------------------------------------------- the probes


def layer_kinds(spec: ModelSpec) -> tuple[Any, ...]:
    """A key per decoder layer: its attention type (``layer_types``) and its parameter layout (dense or MoE)."""
    types = getattr(spec.resolved, "layer_types", None) or ("",) * spec.num_hidden_layers
    return tuple(zip(types, spec.layer_layouts, strict=False))


def prefix_length(spec: ModelSpec) -> int:
    """The shortest prefix holding layer 0 and one layer of every kind after it."""
    kinds = layer_kinds(spec)
    firsts = {kinds[r]: r for r in range(len(kinds) - 1, 0, -1)}
    return max(2, 1 + max(firsts.values(), default=1))


def prefix_spec(spec: ModelSpec, layers: int) -> ModelSpec:
    """``spec`` cut to its first ``layers`` decoder layers (``layer_types`` cut with it)."""
    raw = {**dict(spec.config), "num_hidden_layers": layers, "n_layer": layers}
    if "n_layer" not in spec.config:
        raw.pop("n_layer")
    types = getattr(spec.resolved, "layer_types", None)
    if types is not None:
        raw["layer_types"] = list(types[:layers])
    return model_from_config(raw, f"{spec.name}[:{layers}]")


def probe_sizes(spec: ModelSpec, probe: Probe) -> tuple[tuple[int, int], ...]:
    """The (batch, seq) sizes a trace runs, on the setup's side of the sliding window."""
    window = spec.sliding_window
    if window is None:
        s0 = BASE_SEQ
    elif probe.beyond_window:
        s0 = window
    else:
        s0 = min(BASE_SEQ, (window - 1) // 3)
        if s0 < 2:
            raise InvalidValueError(f"model {spec.name!r}: a sliding window of {window} tokens is too short to trace")
    batches = (1,) if probe.single_batch else BATCHES
    return tuple((b, k * s0) for b in batches for k in (1, 2, 3))


def _model_and_layers(spec: ModelSpec, probe: Probe) -> tuple[Any, list[Any]]:
    method = "lora" if probe.lora_rank else "full"
    # precision only validates here: the dtypes are the probe's
    setup = make_setup(gpus=1, model=spec, gpu="a100-80gb", method=method, precision="fp32", attention=probe.attention,
                       lora_rank=probe.lora_rank or 8, lora_targets=probe.lora_targets or ("all-linear",), batch=1,
                       seq=2)
    model = build_model(setup, "meta", probe.dtypes)
    return model, decoder_layers(model)


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers in order (instances of its ``_no_split_modules`` classes)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(base._no_split_modules or ())
    return [m for m in base.modules() if type(m).__name__ in names]


@dataclass
class _Saved:
    owner: str | int  # layer index, SHARED or OUTSIDE
    nbytes: int
    storage: Any  # kept alive so that its identity stays unique


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def saved_storages(spec: ModelSpec, probe: Probe, batch: int, seq: int) -> tuple[list[_Saved], int]:
    """Every storage one forward with loss saves for backward, in order of first save, with its owner; and the
    residual stream's bytes per element (the second layer's input)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, layers = _model_and_layers(spec, probe)
    saved: dict[int, _Saved] = {}
    stack: list[int] = []
    inputs: dict[int, set[int]] = {}  # layer -> storages of its inputs other than the hidden states
    stream = [0]

    def pre(index: int) -> Any:
        def hook(module: Any, args: Any, kwargs: Any) -> None:
            hidden = args[0] if args else kwargs.get("hidden_states")
            others = [*_tensors(args[1:]), *_tensors(kwargs)]
            inputs[index] = {t.untyped_storage()._cdata for t in others if t is not hidden}
            if index == 1 and hidden is not None:
                stream[0] = hidden.element_size()
            stack.append(index)
        return hook

    def post(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        stack.pop()

    def pack(t: Any) -> Any:
        if t.dim() == 0:  # scalars (the loss's normaliser, Gemma's embedding scale): a few bytes, left out
            return t
        storage = t.untyped_storage()
        key = storage._cdata
        if key in params:
            return t
        here: str | int = stack[-1] if stack else OUTSIDE
        if stack and key in inputs.get(stack[-1], ()):
            here = SHARED
        found = saved.get(key)
        if found is None:
            saved[key] = _Saved(here, storage.nbytes(), storage)
        elif found.owner != here and isinstance(found.owner, int) and isinstance(here, int):
            found.owner = SHARED  # one tensor saved by two layers
        return t

    handles = []
    with quiet_libraries(), real_data_decisions(), FakeTensorMode(allow_non_fake_inputs=True):
        to_empty_tied(model)
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        for index, layer in enumerate(layers):
            handles.append(layer.register_forward_pre_hook(pre(index), with_kwargs=True))
            handles.append(layer.register_forward_hook(post, with_kwargs=True))
        try:
            ids = torch.randint(0, spec.vocab_size, (batch, seq))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model(input_ids=ids, labels=ids)
        finally:
            for handle in handles:
                handle.remove()
    return list(saved.values()), stream[0]


def _solve(rows: list[list[Fraction]], values: list[Fraction]) -> list[Fraction]:
    """Gauss-Jordan elimination on a small invertible system, exactly."""
    n = len(rows)
    m = [[*row, value] for row, value in zip(rows, values, strict=True)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if m[r][col] != 0)
        m[col], m[pivot] = m[pivot], m[col]
        m[col] = [x / m[col][col] for x in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0:
                m[r] = [a - m[r][col] * b for a, b in zip(m[r], m[col], strict=True)]
    return [m[r][n] for r in range(n)]


def _fit(spec: ModelSpec, sizes: tuple[tuple[int, int], ...], runs: list[list[_Saved]]) -> dict[str | int, Polynomial]:
    """Each storage's bytes as a polynomial in batch and sequence, solved from its bytes at ``sizes``."""
    first = runs[0]
    if any(len(run) != len(first) or any(a.owner != b.owner for a, b in zip(first, run, strict=False))
           for run in runs[1:]):
        raise InvalidValueError(
            f"model {spec.name!r}: the probe sizes save different tensors ({', '.join(str(len(r)) for r in runs)}); "
            "its saved activations are not a polynomial in batch and sequence length, so they are not scaled"
        )
    terms = [t for t in TERMS if not (t[0] and len({b for b, _ in sizes}) == 1)]  # batch 1: no batch terms
    rows = [[Fraction(b**i * s**j) for i, j in terms] for b, s in sizes]
    parts: dict[str | int, Polynomial] = {}
    for k, item in enumerate(first):
        coeffs = _solve(rows, [Fraction(run[k].nbytes) for run in runs])
        found = tuple((i, j, float(c)) for (i, j), c in zip(terms, coeffs, strict=True) if c)
        parts[item.owner] = parts.get(item.owner, Polynomial()) + Polynomial(found)
    return parts


def _trace(spec: ModelSpec, probe: Probe) -> LayerTrace:
    start = time.perf_counter()
    n = prefix_length(spec)
    cut = prefix_spec(spec, n)
    sizes = probe_sizes(spec, probe)
    runs, streams = zip(*(saved_storages(cut, probe, b, s) for b, s in sizes), strict=True)
    parts = _fit(cut, sizes, list(runs))
    kinds = layer_kinds(spec)
    probe_kinds = layer_kinds(cut)
    index = {probe_kinds[q]: q for q in range(n - 1, 0, -1)}
    return LayerTrace(
        first=parts.get(0, Polynomial()), layers=tuple(parts.get(q, Polynomial()) for q in range(1, n)),
        kinds=tuple(index[kinds[r]] - 1 for r in range(1, spec.num_hidden_layers)),
        shared=parts.get(SHARED, Polynomial()), outside=parts.get(OUTSIDE, Polynomial()), stream_bytes=streams[0],
        probe_layers=n, seconds=time.perf_counter() - start,
    )


# ------------------------------------------------------------------------------------------ memo and cache

_MEMO: BoundedMemo[tuple, LayerTrace] = BoundedMemo()


def cache_key(spec: ModelSpec, probe: Probe) -> str:
    """sha256 over the config, the probe, the library versions and :data:`LAYER_TRACE_VERSION`."""
    payload = {"config": dict(spec.config), "probe": [probe.dtypes.storage, probe.dtypes.autocast,
               probe.dtypes.adapters_fp32, probe.lora_rank, list(probe.lora_targets), probe.attention,
               probe.beyond_window, probe.single_batch], "versions": library_versions(), "version": LAYER_TRACE_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def trace_layers(spec: ModelSpec, probe: Probe, *, use_cache: bool = True) -> LayerTrace:
    """The :class:`LayerTrace` of ``spec`` under ``probe``: memoised in the process, cached on disk."""
    memo = (spec.name, spec.config.get("_source"), probe)
    if use_cache and memo in _MEMO:
        return _MEMO[memo]
    path = paths.cache_dir() / f"layers-{cache_key(spec, probe)}.json"
    result = None
    if use_cache and path.is_file():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            result = LayerTrace.from_json(json.loads(path.read_text()))
    if result is None:
        result = _trace(spec, probe)
        write_json_atomic(path, result.to_json())
    _MEMO[memo] = result
    return result


def whole_model_saved(spec: ModelSpec, probe: Probe, batch: int, seq: int) -> dict[str, int]:
    """The same accounting over the whole model at one size, no scaling: bytes saved by the first layer, the later
    layers, shared by the layers, and outside them (autocast's weight copies included)."""
    totals = dict.fromkeys((FIRST, LATER, SHARED, OUTSIDE), 0)
    for item in saved_storages(spec, probe, batch, seq)[0]:  # NB: probe.single_batch must say whether batch is 1
        part = FIRST if item.owner == 0 else LATER if isinstance(item.owner, int) else item.owner
        totals[part] += item.nbytes
    return totals


def predicted_saved(trace: LayerTrace, batch: int, seq: int) -> dict[str, int]:
    """:func:`whole_model_saved`'s parts as the one-layer trace predicts them."""
    later = trace.later_layers(batch, seq) + trace.later_layers(batch, seq, fixed=True)
    return {FIRST: trace.first.at(batch, seq), LATER: later, SHARED: trace.shared.at(batch, seq),
            OUTSIDE: trace.outside.at(batch, seq)}
