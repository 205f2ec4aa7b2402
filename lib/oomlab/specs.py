"""Model and GPU specifications, shipped as JSON under ``specs/`` and loaded into frozen dataclasses.

Model specs are the fields of a Hugging Face ``config.json`` (plus ``_source``, where they come from);
GPU specs carry their capacity in bytes as PyTorch reports it and a citation per figure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab.errors import InvalidValueError, UnknownNameError
from oomlab.paths import GPU_SPECS_DIR, MODEL_SPECS_DIR

# --------------------------------------------------------------------------------------------- dtypes


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


# --------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as described by its Hugging Face ``config.json``."""

    name: str  # short name ("llama-13b") or the config path it was read from
    model_type: str  # HF model_type: "llama", "mistral"
    hidden_size: int  # h
    intermediate_size: int  # MLP width (SwiGLU: three h x i matrices)
    num_hidden_layers: int  # L
    num_attention_heads: int  # a
    num_key_value_heads: int  # GQA groups (== a without GQA)
    vocab_size: int  # V
    max_position_embeddings: int
    tie_word_embeddings: bool
    source: str  # where the config comes from
    config: MappingProxyType = field(compare=False, repr=False)  # the raw config.json fields

    def __hash__(self) -> int:  # equal specs have equal names; hashing every field is slow in hot loops
        return hash(self.name)

    @cached_property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.hidden_size // self.num_attention_heads)

    @cached_property
    def num_parameters(self) -> int:
        """Parameter count from the shapes (checked against the meta-built model in tests)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = h * self.num_attention_heads * self.head_dim
        kv = 2 * h * self.num_key_value_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        bias = 0
        if self.config.get("attention_bias"):
            kv_heads = self.num_key_value_heads
            bias += self.num_attention_heads * self.head_dim + 2 * kv_heads * self.head_dim + h
        if self.config.get("mlp_bias"):
            bias += 2 * i + h
        per_layer = q + kv + o + 3 * h * i + 2 * h + bias
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * per_layer + h + head

    def hf_config(self) -> Any:
        """A ``transformers`` config object (no hub access)."""
        from transformers import AutoConfig

        fields = {k: v for k, v in self.config.items() if not k.startswith("_") and k != "model_type"}
        return AutoConfig.for_model(self.model_type, **fields)


def known_models() -> list[str]:
    """Names of the model specs shipped with oomlab."""
    return sorted(p.stem for p in MODEL_SPECS_DIR.glob("*.json"))


def _model_from_dict(name: str, raw: dict[str, Any], source: str) -> ModelSpec:
    try:
        heads = int(raw["num_attention_heads"])
        return ModelSpec(
            name=name,
            model_type=str(raw.get("model_type", "llama")),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            vocab_size=int(raw["vocab_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            source=str(raw.get("_source", source)),
            config=MappingProxyType(dict(raw)),
        )
    except KeyError as err:
        raise InvalidValueError(f"model config {source!r} lacks the field {err.args[0]!r}") from err


def model_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """A spec from ``config.json`` fields in memory (tiny test models, say)."""
    return _model_from_dict(name, dict(config), f"<in-memory config {name}>")


@cache
def load_model(name_or_path: str) -> ModelSpec:
    """Load a shipped model spec by name (``llama-13b``) or a local ``config.json`` path."""
    key = str(name_or_path).strip()
    shipped = MODEL_SPECS_DIR / f"{key.lower()}.json"
    if shipped.is_file():
        return _model_from_dict(key.lower(), json.loads(shipped.read_text()), str(shipped))
    path = Path(key).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise InvalidValueError(f"model config {str(path)!r} is not valid JSON: {err}") from err
        return _model_from_dict(str(path), raw, str(path))
    raise UnknownNameError("model", name_or_path, known_models(), "or give a path to a config.json")


# ----------------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: memory as PyTorch sees it, throughput, host link, and a source per figure."""

    name: str  # short name: "t4"
    display_name: str  # "Tesla T4"
    total_memory_bytes: int  # torch.cuda.get_device_properties().total_memory ("total capacity")
    nvidia_smi_total_mib: int  # nvidia-smi "Total" column
    compute_capability: tuple[int, int]
    bf16: bool  # native bfloat16 support (compute capability >= 8.0)
    peak_fp16_flops: float  # dense tensor-core FLOP/s
    peak_bf16_flops: float | None  # None without bf16
    peak_fp32_flops: float
    memory_bandwidth_bytes_per_s: int
    host_link: str  # "PCIe 3.0 x16"
    host_link_bytes_per_s: int  # per direction
    sources: MappingProxyType = field(compare=False, repr=False)
    notes: str = field(default="", compare=False, repr=False)

    def __hash__(self) -> int:  # equal specs have equal names
        return hash(self.name)


def known_gpus() -> list[str]:
    """Names of the GPU specs shipped with oomlab."""
    return sorted(p.stem for p in GPU_SPECS_DIR.glob("*.json"))


@cache
def load_gpu(name: str) -> GPUSpec:
    """Load a shipped GPU spec by name (``t4``, ``a100-80gb`` ...)."""
    key = str(name).strip().lower()
    path = GPU_SPECS_DIR / f"{key}.json"
    if not path.is_file():
        raise UnknownNameError("GPU", name, known_gpus())
    raw = json.loads(path.read_text())
    return GPUSpec(
        name=raw["name"],
        display_name=raw["display_name"],
        total_memory_bytes=int(raw["total_memory_bytes"]),
        nvidia_smi_total_mib=int(raw["nvidia_smi_total_mib"]),
        compute_capability=tuple(raw["compute_capability"]),
        bf16=bool(raw["bf16"]),
        peak_fp16_flops=float(raw["peak_fp16_flops"]),
        peak_bf16_flops=None if raw["peak_bf16_flops"] is None else float(raw["peak_bf16_flops"]),
        peak_fp32_flops=float(raw["peak_fp32_flops"]),
        memory_bandwidth_bytes_per_s=int(raw["memory_bandwidth_bytes_per_s"]),
        host_link=raw["host_link"],
        host_link_bytes_per_s=int(raw["host_link_bytes_per_s"]),
        sources=MappingProxyType(dict(raw["sources"])),
        notes=raw.get("notes", ""),
    )
