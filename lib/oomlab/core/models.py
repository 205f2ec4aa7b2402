"""Model specifications: the fields of a Hugging Face ``config.json`` (plus ``_source``), loaded into a frozen
:class:`ModelSpec` that also carries the model's geometry (projection shapes, head dimensions, parameter count).

Shipped specs live in ``specs/models/*.json``; a path to a ``config.json`` (or its folder) works the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.paths import MODEL_SPECS_DIR

# The decoder layer's projections, in the order transformers registers them (attention, then MLP).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
    def q_dim(self) -> int:
        """Width of the query projection's output: heads x head dimension."""
        return self.num_attention_heads * self.head_dim

    @cached_property
    def kv_dim(self) -> int:
        """Width of the key (and value) projection's output: KV heads x head dimension."""
        return self.num_key_value_heads * self.head_dim

    @cached_property
    def projection_shapes(self) -> MappingProxyType:
        """``{projection: (in_features, out_features)}`` of one decoder layer, in :data:`PROJECTIONS` order."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_dim, self.kv_dim
        return MappingProxyType({"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                                 "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)})

    @cached_property
    def layer_matmul_params(self) -> int:
        """Parameters of one decoder layer's projection matrices (what QLoRA quantizes, what FLOPs multiply)."""
        return sum(n_in * n_out for n_in, n_out in self.projection_shapes.values())

    @cached_property
    def embedding_params(self) -> int:
        """The token embedding (``V x h``); the LM head has as many unless tied."""
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        """The untied LM head's parameters (0 when it shares the embedding's weight)."""
        return 0 if self.tie_word_embeddings else self.embedding_params

    @cached_property
    def num_parameters(self) -> int:
        """Parameter count from the shapes (checked against the meta-built model in tests)."""
        h, i = self.hidden_size, self.intermediate_size
        bias = 0
        if self.config.get("attention_bias"):
            bias += self.q_dim + 2 * self.kv_dim + h
        if self.config.get("mlp_bias"):
            bias += 2 * i + h
        per_layer = self.layer_matmul_params + 2 * h + bias
        return self.embedding_params + self.num_hidden_layers * per_layer + h + self.lm_head_params

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
