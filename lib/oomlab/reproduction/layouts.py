"""LLaMA's module layout across transformers releases, and the ``Module._apply`` walk of each.

The layouts ship as data (``data/llama-layouts.json``), read off each release's
``src/transformers/models/llama/modeling_llama.py``: which rotary buffers exist per decoder layer and on the model,
their shapes, dtypes and persistence, LlamaModel's own buffers, and the order the MLP registers its projections.
Each released layout carries the fingerprint of the real walk of that release (LLaMA-13B built on ``meta`` by the
old transformers itself), before and after ``.half()``.

:func:`build_layout_model` rebuilds a layout on the model the installed transformers builds, by editing only what
the data describes (documented there); :func:`layout_walk` runs PyTorch's own ``model.to("cuda")`` on it against an
unlimited allocator. A test checks each rebuilt walk against the fingerprint of the release it stands for, so no
shape here is invented.

Limitations: LLaMA only (the layouts are LLaMA's); parameters are the installed transformers' (the same in every
layout for a LLaMA-1 config: no biases, as many key/value heads as heads); ``persistent`` is recorded but does not
change the walk (``.to()`` moves persistent and non-persistent buffers alike).
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import torch

from oomlab.core.dtypes import DType, load_dtype
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.modeling import build_meta_model
from oomlab.core.models import Family, ModelSpec, load_model
from oomlab.core.paths import DATA_DIR
from oomlab.reproduction.allocator import CachingAllocator
from oomlab.reproduction.steps import UNLIMITED_BYTES, WalkStep
from oomlab.reproduction.traced_walk import SimulatedCudaMode, tensor_names

__all__ = ["LaunchPath", "LayoutBuffer", "LlamaLayout", "ReportContext", "build_layout_model", "layout_walk",
           "llama_layouts", "load_layout", "report_context", "walk_fingerprint"]

LLAMA_LAYOUTS = DATA_DIR / "llama-layouts.json"
_DTYPES = {"float32": torch.float32, "bool": torch.bool, "int64": torch.int64}  # "default": the load dtype


class LaunchPath(enum.Enum):
    """How the launcher moves the model, as far as buffer dtypes are concerned."""

    TO = "to"  # model.to(device), no dtype: buffers keep the dtype they were built in (HF Trainer, a plain script)
    HALF_THEN_TO = "half-then-to"  # module.half() then .to(device): floating buffers float16 (DeepSpeed fp16 engine)


@dataclass(frozen=True)
class LayoutBuffer:
    """One registered buffer of a layout: shape in the data's symbols, dtype as built."""

    name: str
    shape: tuple[int | str, ...]  # ints, or "P" (max_position_embeddings), "hd" (head_dim), "hd/2"
    dtype: str  # "float32", "default" (the load dtype), "bool" or "int64"
    persistent: bool

    def concrete_shape(self, head_dim: int, positions: int) -> tuple[int, ...]:
        symbols = {"P": positions, "hd": head_dim, "hd/2": head_dim // 2}
        return tuple(symbols[s] if isinstance(s, str) else s for s in self.shape)

    def torch_dtype(self, load: DType, path: LaunchPath) -> torch.dtype:
        built = load.torch_dtype() if self.dtype == "default" else _DTYPES[self.dtype]
        if path is LaunchPath.HALF_THEN_TO and built.is_floating_point:
            return torch.float16
        return built


@dataclass(frozen=True)
class LlamaLayout:
    """LLaMA's layout in a range of transformers releases (or in unreleased code), with its source."""

    id: str  # e.g. "4.28", or "pre-22234" for git main before transformers#22234
    transformers: str  # the version range, e.g. ">=4.28.0,<4.31.0"
    released: bool
    first_release: str | None  # e.g. "4.28.0"
    first_release_date: dt.date | None  # the release's wheel build date
    source_url: str  # the tag's modeling_llama.py, or the pull request for unreleased code
    source_note: str  # how it was read
    mlp_order: tuple[str, ...]  # LlamaMLP's projections in registration order
    layer_rotary: tuple[LayoutBuffer, ...]  # buffers of model.layers.N.self_attn.rotary_emb (none: no such module)
    model_rotary: tuple[LayoutBuffer, ...]  # buffers of model.rotary_emb, registered after model.norm
    model_buffers: tuple[LayoutBuffer, ...]  # LlamaModel's own buffers (visited after all its children)
    fingerprints: dict[LaunchPath, tuple[int, str]] | None  # the real walk of the release: (tensors, sha256)
    probed: tuple[str, ...]  # releases whose real walk gave the fingerprint
    notes: tuple[str, ...]

    @property
    def moves_rotary_caches(self) -> bool:
        """Does ``.to()`` move per-layer cos/sin caches (anything per layer beyond ``inv_freq``)?"""
        return any(b.name != "inv_freq" for b in self.layer_rotary)

    @property
    def rotary_summary(self) -> str:
        """The rotary buffers in a few words, e.g. ``per layer: inv_freq, cos_cached, sin_cached``."""
        parts = []
        if self.layer_rotary:
            parts.append("per layer: " + ", ".join(b.name for b in self.layer_rotary))
        if self.model_rotary:
            parts.append("model: " + ", ".join(b.name for b in self.model_rotary))
        return "; ".join(parts) or "none"

    def cache_bytes_per_layer(self, spec: ModelSpec, load: DType, path: LaunchPath) -> int:
        """Bytes ``.to()`` moves per decoder layer for rotary buffers other than ``inv_freq`` (the cos/sin caches)."""
        positions = int(spec.resolved.max_position_embeddings)
        return sum(math.prod(b.concrete_shape(spec.head_dim, positions))
                   * torch.empty((), dtype=b.torch_dtype(load, path)).element_size()
                   for b in self.layer_rotary if b.name != "inv_freq")

    def available_on(self, day: dt.date) -> bool:
        """Was this layout in a release on ``day``? (Unreleased code: False.)"""
        return self.first_release_date is not None and self.first_release_date <= day


@dataclass(frozen=True)
class ReportContext:
    """What the layouts are compared with: the public twin of the seed report."""

    report_url: str
    opened: dt.date
    message_format: str
    pin: str  # Open-Assistant's transformers pin
    pin_note: str  # why its layout is unknown


def _buffers(items: Sequence[dict[str, Any]]) -> tuple[LayoutBuffer, ...]:
    return tuple(LayoutBuffer(b["name"], tuple(b["shape"]), b["dtype"], b["persistent"]) for b in items)


def _date(text: str | None) -> dt.date | None:
    return dt.date.fromisoformat(text) if text else None


@cache
def _data() -> dict[str, Any]:
    return json.loads(LLAMA_LAYOUTS.read_text(encoding="utf-8"))


@cache
def llama_layouts() -> tuple[LlamaLayout, ...]:
    """Every shipped layout, oldest first."""
    out = []
    for item in _data()["layouts"]:
        source = item["source"]
        walk = item["walk"]
        out.append(LlamaLayout(
            id=item["id"], transformers=item["transformers"], released=item["released"],
            first_release=item["first_release"], first_release_date=_date(item["first_release_date"]),
            source_url=source.get("url") or source["pull"], source_note=source["read_from"],
            mlp_order=tuple(item["mlp_order"]), layer_rotary=_buffers(item["layer_rotary"]),
            model_rotary=_buffers(item["model_rotary"]), model_buffers=_buffers(item["model_buffers"]),
            fingerprints=None if walk is None else {
                path: (walk[path.value]["count"], walk[path.value]["sha256"]) for path in LaunchPath},
            probed=tuple(item["checked"]["probed_here"]), notes=tuple(item["notes"]),
        ))
    return tuple(out)


def load_layout(layout_id: str) -> LlamaLayout:
    """The layout named ``layout_id`` (e.g. ``"4.28"``)."""
    for layout in llama_layouts():
        if layout.id == layout_id:
            return layout
    raise UnknownNameError("LLaMA layout", layout_id, [lay.id for lay in llama_layouts()])


def report_context() -> ReportContext:
    """The public twin of the seed report, its date and Open-Assistant's transformers pin."""
    ctx = _data()["compared_with"]
    pin = ctx["open_assistant_pin"]
    return ReportContext(ctx["report"], dt.date.fromisoformat(ctx["opened"]), ctx["message_format"],
                         pin["transformers"], pin["why_unknown"])


def _rotary_module(buffers: Sequence[LayoutBuffer], spec: ModelSpec, load: DType, path: LaunchPath) -> Any:
    module = torch.nn.Module()
    for b in buffers:
        shape = b.concrete_shape(spec.head_dim, int(spec.resolved.max_position_embeddings))
        module.register_buffer(b.name, torch.empty(shape, dtype=b.torch_dtype(load, path), device="meta"),
                               persistent=b.persistent)
    return module


def _insert_after(modules: dict[str, Any], after: str, name: str, module: Any) -> None:
    items = [(k, v) for k, v in modules.items() if k != name]
    modules.clear()
    for key, value in items:
        modules[key] = value
        if key == after:
            modules[name] = module


def build_layout_model(spec: ModelSpec, dtype: DType, layout: LlamaLayout, path: LaunchPath) -> Any:
    """The meta model of ``spec`` in ``dtype`` with ``layout``'s buffers, as ``path`` leaves them before ``.to()``.

    Starting from the model the installed transformers builds (its parameters kept), every rotary module and every
    buffer of LlamaModel itself is removed, then: a per-layer ``self_attn.rotary_emb`` holding ``layout_rotary`` is
    registered right after ``o_proj`` (where ``LlamaAttention.__init__``/``_init_rope`` created it); a model-level
    ``model.rotary_emb`` holding ``model_rotary`` right after ``model.norm``; ``model_buffers`` on LlamaModel; the
    MLP's children are put in ``mlp_order``. Buffer shapes come from the data's symbols (``P``, ``hd``), dtypes from
    the data and the launch path (``.half()`` makes floating buffers float16).
    """
    if spec.family is not Family.LLAMA:
        raise InvalidValueError(f"invalid model {spec.name!r} for the LLaMA layouts: it is a {spec.family.value} "
                                f"model; the layouts describe LLaMA (model_type 'llama') only")
    model = build_meta_model(spec, dtype)
    inner = model.model
    inner._modules.pop("rotary_emb", None)
    for name in list(inner._buffers):
        delattr(inner, name)
    for b in layout.model_buffers:
        shape = b.concrete_shape(spec.head_dim, int(spec.resolved.max_position_embeddings))
        inner.register_buffer(b.name, torch.empty(shape, dtype=b.torch_dtype(dtype, path), device="meta"),
                              persistent=b.persistent)
    if layout.model_rotary:
        _insert_after(inner._modules, "norm", "rotary_emb", _rotary_module(layout.model_rotary, spec, dtype, path))
    for layer in inner.layers:
        attn = layer.self_attn
        attn._modules.pop("rotary_emb", None)
        if layout.layer_rotary:
            _insert_after(attn._modules, "o_proj", "rotary_emb", _rotary_module(layout.layer_rotary, spec, dtype, path))
        mlp = layer.mlp._modules
        rest = [(k, v) for k, v in mlp.items() if k not in layout.mlp_order]
        ordered = [(k, mlp[k]) for k in layout.mlp_order]
        mlp.clear()
        mlp.update(ordered + rest)
    return model


@lru_cache(maxsize=256)  # keyed by user input (a config.json path): bounded
def layout_walk(model: str, dtype: str, layout_id: str, path: LaunchPath = LaunchPath.TO) -> tuple[WalkStep, ...]:
    """The whole ``model.to("cuda")`` walk of ``model`` in ``dtype`` under one layout, on a device without limit."""
    spec, dt_, layout = load_model(model), load_dtype(dtype), load_layout(layout_id)
    meta_model = build_layout_model(spec, dt_, layout, path)
    mode = SimulatedCudaMode(CachingAllocator(UNLIMITED_BYTES), tensor_names(meta_model))
    with mode:
        meta_model.to("cuda")
    return tuple(mode.steps)


def walk_fingerprint(steps: Sequence[WalkStep]) -> tuple[int, str]:
    """``(tensors, sha256)`` of a walk's ``name kind shape dtype`` lines, as the layout data records them."""
    lines = [f"{s.name} {s.kind.value} {'x'.join(map(str, s.shape)) or '-'} {s.dtype}" for s in steps]
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()
