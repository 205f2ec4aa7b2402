"""Model specifications: a Hugging Face ``config.json`` (plus ``_source``) read through transformers' own config class
(``AutoConfig.for_model``), loaded into a frozen :class:`ModelSpec` that carries the model's geometry -- every decoder
layer's parameters as transformers builds them (:class:`LayerLayout`), head dimensions, the parameter count.

Defaults and derived fields come from the config class, never guessed: Gemma's and Falcon's tied embeddings (absent
from their ``config.json``), Falcon's ``n_head``/``n_layer`` aliases and ``ffn_hidden_size``, Qwen2's implicit q/k/v
biases, ``head_dim`` where it is not ``hidden / heads``.  Each :class:`Family` states the layout of its decoder layer
(read off ``transformers/models/<family>/modeling_<family>.py``); tests check every shipped spec's layout and count
against the model built on ``meta``.  What is not a supported decoder-only family is refused by :func:`check_supported`
before any work.

Shipped specs live in ``specs/models/*.json``; a path to a ``config.json`` (or its folder) works the same way.  A
shipped spec is resolved from the committed table of what its config class resolved
(:mod:`oomlab.core.resolved`, re-derived by a test), so the analytic path imports no transformers; a user's
``config.json`` goes through the config class itself.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.layouts import (  # noqa: F401  (ALL_LINEAR, PROJECTIONS: re-exported)
    ALL_LINEAR,
    FAMILY_NAMES,
    LAYERNORM_FAMILIES,
    PROJECTIONS,
    Family,
    LayerLayout,
    head_dim_of,
    kv_dim_of,
    kv_heads_of,
    layer_layout,
    q_dim_of,
)
from oomlab.core.paths import MODEL_SPECS_DIR
from oomlab.core.resolved import LEGACY_KEYS, ResolvedConfig, config_object, shipped_resolved
from oomlab.core.user_input import SHOWN_CHARS, load_user_json, read_user_text, shown


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as described by its Hugging Face ``config.json`` and read by its config class."""

    name: str  # short name ("llama-13b") or the config path it was read from
    model_type: str  # HF model_type: "llama", "mistral", ...
    hidden_size: int  # h
    intermediate_size: int  # MLP width (SwiGLU: three h x i matrices; MoE: one expert's)
    num_hidden_layers: int  # L
    num_attention_heads: int  # a
    num_key_value_heads: int  # GQA groups (== a without GQA; 1 for multi-query)
    vocab_size: int  # V
    max_position_embeddings: int
    tie_word_embeddings: bool  # as the config class resolves it (Gemma, Falcon: true by default)
    source: str  # where the config comes from
    config: MappingProxyType = field(compare=False, repr=False)  # the raw config.json fields

    def __hash__(self) -> int:  # equal specs have equal names; hashing every field is slow in hot loops
        return hash(self.name)

    @cached_property
    def family(self) -> Family:
        return Family(self.model_type)

    @cached_property
    def resolved(self) -> Any:
        """The config as its class resolves it (defaults filled in), read by attribute: for a shipped spec the
        committed :class:`~oomlab.core.resolved.ResolvedConfig` (no transformers), else the transformers config object;
        shared -- do not modify (see :meth:`hf_config`)."""
        return self.hf_config()

    @cached_property
    def head_dim(self) -> int:
        return head_dim_of(self.resolved)

    @cached_property
    def q_dim(self) -> int:
        """Width of the query projection's output: heads x head dimension (:func:`oomlab.core.layouts.q_dim_of`)."""
        return q_dim_of(self.resolved)

    @cached_property
    def kv_dim(self) -> int:
        """Width of the key (and value) projection's output: KV heads x head dimension, Falcon's multi-query one head
        (:func:`oomlab.core.layouts.kv_dim_of`)."""
        return kv_dim_of(self.resolved)

    @cached_property
    def sliding_window(self) -> int | None:
        """The attention window of sliding-window layers, if any layer has one (``None``: every layer is global)."""
        window = getattr(self.resolved, "sliding_window", None)
        types = getattr(self.resolved, "layer_types", None)
        if not window or (types is not None and "sliding_attention" not in types) \
                or getattr(self.resolved, "use_sliding_window", True) is False:
            return None
        return int(window)

    @cached_property
    def layer_layouts(self) -> tuple[LayerLayout, ...]:
        """Every decoder layer's :class:`LayerLayout` (equal layers share one object)."""
        seen: dict[LayerLayout, LayerLayout] = {}
        out = []
        for index in range(self.num_hidden_layers):
            layout = layer_layout(self.family, self.resolved, index)
            out.append(seen.setdefault(layout, layout))
        return tuple(out)

    @cached_property
    def layer(self) -> LayerLayout:
        """The most common layer's layout (every layer's, for every shipped spec)."""
        return Counter(self.layer_layouts).most_common(1)[0][0]

    @cached_property
    def uniform_layers(self) -> bool:
        return len(set(self.layer_layouts)) == 1

    @cached_property
    def projection_shapes(self) -> MappingProxyType:
        """``{module name: (in_features, out_features)}`` of the layer's nn.Linear modules, as registered.

        NB: of the most common layer (Qwen-MoE configs with ``mlp_only_layers`` mix dense and sparse layers).
        """
        return MappingProxyType({k: (p.in_features, p.out_features) for k, p in self.layer.projections.items()})

    @cached_property
    def lora_target_names(self) -> tuple[str, ...]:
        """The module names LoRA can target (peft matches a target against a module name's last part)."""
        names: dict[str, None] = {}
        for layout in self.layer_layouts:
            names.update(dict.fromkeys(k.rsplit(".", 1)[-1] for k in layout.projections))
        return tuple(names)

    @cached_property
    def attention_projections(self) -> tuple[str, ...]:
        """The attention's own projections: what the default LoRA targets (LLaMA's q/k/v/o) mean in this family."""
        first_mlp = {"gate_proj", "gate_up_proj", "fc1", "dense_h_to_4h", "shared_expert.gate_proj"}
        names = []
        for name in self.layer_layouts[0].projections:
            if name in first_mlp:
                break
            names.append(name)
        return tuple(names)

    def layer_lora_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        """Adapter parameters of one (the most common) layer: ``r (in + out)`` per targeted nn.Linear."""
        chosen = set(targets)
        return sum(rank * (p.in_features + p.out_features) for name, p in self.layer.projections.items()
                   if name.rsplit(".", 1)[-1] in chosen)

    def lora_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        """Adapter parameters over every layer: ``r (in + out)`` per targeted nn.Linear (Hu et al. 2021)."""
        chosen = set(targets)
        return sum(rank * (p.in_features + p.out_features) for layout in self.layer_layouts
                   for name, p in layout.projections.items() if name.rsplit(".", 1)[-1] in chosen)

    @cached_property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's nn.Linear modules (what QLoRA quantizes; MoE experts' 3-D tensors excluded)."""
        return self.layer.linear_weight_params

    @cached_property
    def layer_params(self) -> int:
        """Every parameter of one (the most common) decoder layer: projections, biases, norms, router, experts."""
        return self.layer.params

    @cached_property
    def embedding_params(self) -> int:
        """The token embedding (``V x h``); the LM head has as many unless tied."""
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        """The untied LM head's parameters, its bias included (Phi); 0 when it shares the embedding's weight."""
        bias = self.vocab_size if self.family is Family.PHI else 0
        return bias + (0 if self.tie_word_embeddings else self.embedding_params)

    @cached_property
    def final_norm_params(self) -> int:
        return self.hidden_size * (2 if self.family in LAYERNORM_FAMILIES else 1)

    @cached_property
    def num_parameters(self) -> int:
        """Parameter count from the layouts (tied weights once; checked against the meta-built model in tests)."""
        layers = sum(layout.params for layout in self.layer_layouts)
        return self.embedding_params + layers + self.final_norm_params + self.lm_head_params

    @cached_property
    def active_parameters(self) -> int:
        """Parameters one token runs through: the experts it is routed to only (MoE), everything otherwise."""
        inactive = sum(layout.expert_params * (layout.experts - layout.experts_per_token) // layout.experts
                       for layout in self.layer_layouts if layout.experts)
        return self.num_parameters - inactive

    def attention_implementations(self) -> tuple[str, ...]:
        """The attention implementations (of oomlab's ``eager`` and ``sdpa``) transformers allows for this family."""
        if self.family in _NO_SDPA:
            return ("eager",)
        return ("eager", "sdpa")

    def check_attention(self, attention: str) -> None:
        """Refuse an attention implementation transformers refuses for this model, saying what to pass."""
        allowed = self.attention_implementations()
        if attention not in allowed:
            why = f" ({_NO_SDPA[self.family]})" if self.family in _NO_SDPA else ""
            raise InvalidValueError(
                f"model {self.name!r} ({self.family.value}) cannot run attention {attention!r}: transformers "
                f"supports only {', '.join(repr(a) for a in allowed)} for it{why}"
                + f"; pass attention={allowed[0]!r} (--attention {allowed[0]})"
            )

    def hf_config(self) -> Any:
        """A new ``transformers`` config object for this spec (no hub access): callers may change it."""
        return config_object(self.model_type, self.config)


# families whose transformers class has ``_supports_sdpa = False``, and why (flash / flex attention are not modelled)
_NO_SDPA = {
    Family.GEMMA2: "SDPA cannot soft-cap attention logits",  # modeling_gemma2.py
    Family.GPT_OSS: "SDPA has no attention sinks",  # modeling_gpt_oss.py:380 _supports_sdpa = False
}
# fields a config.json must give (or an alias the config class maps, e.g. Falcon's n_head): no default is a model
_REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
# geometry fields that must be positive integers where a config.json gives them (``null`` allowed only where the
# config class derives the value: ``head_dim``, ``num_key_value_heads``, ...); aliases included
_POSITIVE_INTS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                  "max_position_embeddings", "num_key_value_heads", "head_dim", "n_head", "n_layer", "n_embed",
                  "num_kv_heads", "ffn_hidden_size", "num_local_experts", "num_experts", "num_experts_per_tok",
                  "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
                  "sliding_window")
# The largest value each count may take: far above every released model (LLaMA-3.1-405B: h 16,384, 126 layers,
# 128 heads, i 53,248; DeepSeek-V3: 256 experts; Gemma: V 256,000; Llama-4-Scout: 10M positions), low enough that
# a typo (num_hidden_layers 1000000, hidden_size 2**70) is refused before the per-layer work it would cost
_LIMITS = {
    "hidden_size": 2**17, "n_embed": 2**17, "head_dim": 2**17,
    "intermediate_size": 2**19, "ffn_hidden_size": 2**19, "moe_intermediate_size": 2**19,
    "shared_expert_intermediate_size": 2**19,
    "num_hidden_layers": 1024, "n_layer": 1024, "decoder_sparse_step": 1024,
    "num_attention_heads": 2**12, "n_head": 2**12, "num_key_value_heads": 2**12, "num_kv_heads": 2**12,
    "vocab_size": 2**23,
    "max_position_embeddings": 2**24, "sliding_window": 2**24,
    "num_local_experts": 1024, "num_experts": 1024, "num_experts_per_tok": 1024,
}
# shares of the head dimension (phi, stablelm: partial_rotary_factor; gpt_neox: rotary_pct)
_FRACTIONS = ("partial_rotary_factor", "rotary_pct")
_NULLABLE = frozenset({"intermediate_size", "num_key_value_heads", "head_dim", "num_kv_heads", "ffn_hidden_size",
                       "sliding_window", "max_position_embeddings", "shared_expert_intermediate_size",
                       "moe_intermediate_size"})


def known_models() -> list[str]:
    """Names of the model specs shipped with oomlab."""
    return sorted(p.stem for p in MODEL_SPECS_DIR.glob("*.json"))


def check_supported(raw: Mapping[str, Any], source: str) -> Family:
    """The :class:`Family` of a ``config.json``'s fields, or a clear refusal: what was found, what is supported,
    what to pass instead (encoder-decoder, vision-language, custom code, other architectures)."""
    supported = f"oomlab budgets decoder-only causal LMs of the families {', '.join(FAMILY_NAMES)}"
    instead = f"pass a shipped model ({', '.join(known_models()[:4])}, ...) or the config.json of a supported one"
    model_type = raw.get("model_type")
    if not model_type:
        raise InvalidValueError(f"model config {shown(source)} lacks the field 'model_type' (it names the transformers "
                                f"config class); {supported}")
    architectures = _listed(raw.get("architectures")) or "no architectures listed"
    found = f"model config {shown(source)} is model_type {shown(model_type)} ({architectures})"
    try:
        return Family(model_type)
    except ValueError:
        pass
    # only to say why a config is refused: a supported family never loads transformers here
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    text = raw.get("text_config")
    if model_type not in CONFIG_MAPPING_NAMES:
        what = f"custom code (auto_map: {_listed(raw['auto_map'])}, which needs trust_remote_code)" \
            if raw.get("auto_map") else "unknown to transformers " + _transformers_version()
        raise InvalidValueError(f"{found}: {what}; oomlab builds models with transformers' own classes only. "
                                f"{supported}; {instead}")
    if raw.get("is_encoder_decoder") or model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        raise InvalidValueError(f"{found}: an encoder-decoder model. {supported}; {instead}")
    if isinstance(text, dict) or "vision_config" in raw or model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        hint = ""
        if isinstance(text, dict) and isinstance(text.get("model_type"), str) and text["model_type"] in FAMILY_NAMES:
            hint = f" (its language model is {text['model_type']!r}: save text_config as a config.json to budget it)"
        raise InvalidValueError(f"{found}: a vision-language model{hint}; its vision tower is not budgeted. "
                                f"{supported}; {instead}")
    archs = raw.get("architectures") if isinstance(raw.get("architectures"), list) else ()
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        not archs or any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs))
    kind = "a decoder-only family oomlab does not model yet" if causal else "not a decoder-only causal LM"
    raise InvalidValueError(f"{found}: {kind}. {supported}; {instead}")


def _listed(value: Any) -> str:
    """The names a config.json lists (``architectures``, ``auto_map``'s values), whatever JSON they are: strings
    joined, anything else shown as JSON, clipped."""
    if isinstance(value, Mapping):
        value = list(value.values())
    items = value if isinstance(value, list) else [] if value is None else [value]
    text = ", ".join(item if isinstance(item, str) else json.dumps(item, default=repr) for item in items[:8])
    text += ", ..." if len(items) > 8 else ""
    return text if len(text) <= SHOWN_CHARS else shown(text)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def check_fields(raw: Any, source: str) -> None:
    """Refuse a ``config.json`` that is not an object of fields, or whose geometry fields are not positive integers
    (``"abc"``, ``0``, ``-4096``, ``4096.5``, ``true``): the field, the value and what is accepted."""
    if not isinstance(raw, Mapping):
        raise InvalidValueError(f"model config {shown(source)} must be a JSON object of config fields "
                                f"({{\"model_type\": \"llama\", \"hidden_size\": 4096, ...}}); got a "
                                f"{_json_kind(raw)}")
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise InvalidValueError(f"model config {shown(source)}: field 'model_type' is "
                                f"{_json_text(model_type)}; accepted: a "
                                f"transformers model type string, one of {', '.join(FAMILY_NAMES)}")
    for key in _POSITIVE_INTS:
        if key not in raw or (raw[key] is None and key in _NULLABLE):
            continue
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _LIMITS[key]:
            also = " (or null, to let the config class derive it)" if key in _NULLABLE else ""
            raise InvalidValueError(f"model config {shown(source)}: field {key!r} is {_json_text(value)} "
                                    f"({_json_kind(value, _LIMITS[key])}); "
                                    f"accepted: a positive integer up to {_LIMITS[key]:,}{also}")
    _check_fractions(raw, source)


def _check_fractions(raw: Mapping[str, Any], source: str) -> None:
    """The share of each head's dimensions that rotary embeddings rotate: a number in (0, 1]."""
    for key in _FRACTIONS:
        value = raw.get(key)
        if key in raw and (isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1):
            raise InvalidValueError(f"model config {shown(source)}: field {key!r} is {_json_text(value)}; accepted: "
                                    "a fraction of the head dimension, above 0 and at most 1 (e.g. 0.25)")


def _json_text(value: Any) -> str:
    """``value`` as the config.json wrote it, clipped."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= SHOWN_CHARS else shown(value)


def _json_kind(value: Any, limit: int | None = None) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        if value < 1:
            return "an integer below 1"
        return "an integer" if limit is None or value <= limit else "beyond any model"
    return {str: "a string", float: "a fractional number", list: "list", type(None): "null",
            dict: "object"}.get(type(value), type(value).__name__)


def _check_geometry(spec: ModelSpec, source: str) -> None:
    """What transformers would build wrong or fail on later: heads that do not divide the width or each other."""
    heads, kv = spec.num_attention_heads, spec.num_key_value_heads
    if heads % kv:
        raise InvalidValueError(f"model config {shown(source)}: num_key_value_heads {kv} does not divide "
                                f"num_attention_heads {heads}; accepted: a divisor of {heads} "
                                f"({', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)})")
    if "head_dim" not in spec.config and spec.family is not Family.FALCON and spec.hidden_size % heads:
        raise InvalidValueError(f"model config {shown(source)}: hidden_size {spec.hidden_size} is not a multiple of "
                                f"num_attention_heads {heads}; accepted: a head count that divides it, or an "
                                "explicit head_dim")
    cfg = spec.resolved
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    top_k = getattr(cfg, "num_experts_per_tok", None)
    if experts and top_k and top_k > experts:
        raise InvalidValueError(f"model config {shown(source)}: num_experts_per_tok {top_k} exceeds the {experts} "
                                f"experts; accepted: 1 to {experts} experts per token")


def _model_from_dict(name: str, raw: dict[str, Any], source: str,
                     resolved: ResolvedConfig | None = None) -> ModelSpec:
    """A spec from a ``config.json``'s fields, checked; ``resolved`` (a shipped spec's committed resolution) spares
    running the config class."""
    check_fields(raw, source)
    family = check_supported(raw, source)
    for key in _REQUIRED:
        if key not in raw and not any(alias in raw for alias in _aliases(family, key)):
            raise InvalidValueError(f"model config {shown(source)} lacks the field {key!r} (required: "
                                    f"{', '.join(_REQUIRED)}; accepted: a positive integer)")
    raw = _legacy_rope(family, raw)
    cfg = resolved if resolved is not None else _resolve(family, raw, source)
    intermediate = getattr(cfg, "intermediate_size", None) or cfg.ffn_hidden_size  # Falcon: ffn_hidden_size
    spec = ModelSpec(
        name=name, model_type=family.value, hidden_size=int(cfg.hidden_size), intermediate_size=int(intermediate),
        num_hidden_layers=int(cfg.num_hidden_layers), num_attention_heads=int(cfg.num_attention_heads),
        num_key_value_heads=kv_heads_of(cfg),
        vocab_size=int(cfg.vocab_size), max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.tie_word_embeddings), source=str(raw.get("_source", source)),
        config=MappingProxyType(dict(raw)),
    )
    spec.__dict__["resolved"] = cfg  # fill the cached_property: the config class has run (or its table was read)
    _check_geometry(spec, source)
    return spec


def _legacy_rope(family: Family, raw: dict[str, Any]) -> dict[str, Any]:
    """Phi-3-mini-128k's first configs (and the fine-tunes copied from them) name their rope scaling ``"su"``.
    transformers 5 renames it ``"longrope"`` (``models/phi3/configuration_phi3.py:100-103``) only after validating the
    parameters as LongRoPE's without the top-level ``original_max_position_embeddings`` (a ``KeyError`` in
    ``modeling_rope_utils.py`` ``_check_received_keys``); transformers 4.x ran it.  The rotary scaling moves no
    memory: the spec carries a copy of the fields with ``"longrope"`` (every later build reads it; the file is not
    changed)."""
    scaling = raw.get("rope_scaling")
    if family is not Family.PHI3 or not isinstance(scaling, Mapping) or scaling.get("type") != "su":
        return raw
    return {**raw, "rope_scaling": {**scaling, "type": "longrope"}}


def _resolve(family: Family, raw: Mapping[str, Any], source: str) -> Any:
    """The config object transformers' config class makes of ``raw``, or a refusal quoting its reason."""
    from huggingface_hub.errors import StrictDataclassError  # transformers 5's config validation

    try:
        return config_object(family.value, raw)
    except (TypeError, ValueError, KeyError, StrictDataclassError) as err:  # KeyError: rope parameters missing
        detail = " ".join(str(err).split())
        detail = detail if len(detail) <= 4 * SHOWN_CHARS else detail[:4 * SHOWN_CHARS] + "…"
        raise InvalidValueError(f"model config {shown(source)} is refused by transformers' {family.value} config "
                                f"class: {detail}") from err


def _aliases(family: Family, key: str) -> tuple[str, ...]:
    """Other config.json names for ``key``: the config class's ``attribute_map`` and :data:`_LEGACY_KEYS`."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mapping = {**getattr(CONFIG_MAPPING[family.value], "attribute_map", {}), **LEGACY_KEYS.get(family.value, {})}
    return tuple(alias for alias, target in mapping.items() if target == key)


def model_from_config(config: Mapping[str, Any], name: str, source: str | None = None) -> ModelSpec:
    """A spec from ``config.json`` fields in memory (tiny test models; a run's setup record, which carries the user's
    config fields with the path they were read from as ``source``), checked as :func:`load_model` checks a file's."""
    return _model_from_dict(name, dict(config), source or f"<in-memory config {name}>")


@lru_cache(maxsize=256)  # keyed by user input (a config.json path): bounded
def load_model(name_or_path: str) -> ModelSpec:
    """Load a shipped model spec by name (``llama-13b``) or a local ``config.json`` path (read within
    :mod:`oomlab.core.user_input`'s bounds: a regular file of at most a few MiB, UTF-8, finite numbers)."""
    key = str(name_or_path).strip()
    looks_like_path = "/" in key or "\\" in key or key.lower().endswith(".json")
    shipped = MODEL_SPECS_DIR / f"{key.lower()}.json"
    if not looks_like_path and key.lower() in known_models():
        raw = json.loads(shipped.read_text())
        return _model_from_dict(key.lower(), raw, str(shipped), shipped_resolved(key.lower(), raw))
    path = Path(key).expanduser()
    try:
        if path.is_dir():
            path = path / "config.json"
        if path.suffix == ".json" and (path.exists() or path.is_symlink()):
            return _model_from_dict(str(path), _read_config(path), str(path))
        folder = Path(key).expanduser()
        what = ("no config.json in the folder" if folder.is_dir() else "not a .json file" if folder.exists()
                else "file not found")
    except OSError as err:  # a name too long for the file system, say
        raise InvalidValueError(f"model {shown(key)} is no shipped model and no readable path: "
                                f"{err.strerror or err}; known: {', '.join(known_models())}") from err
    if looks_like_path:  # meant as a path, not a shipped name
        raise InvalidValueError(f"{what}: {key if len(key) <= SHOWN_CHARS else shown(key)} "
                                f"(accepted: a shipped model name -- {', '.join(known_models()[:3])}, "
                                "... -- or the path to an existing config.json or its folder; Hub ids are not "
                                "downloaded: save the model's config.json and pass its path)")
    if len(key) > SHOWN_CHARS:
        raise InvalidValueError(f"unknown model {shown(key)}; known: {', '.join(known_models())} "
                                "(or give a path to a config.json)")
    raise UnknownNameError("model", name_or_path, known_models(), "or give a path to a config.json")


def _read_config(path: Path) -> Any:
    """A user's ``config.json``: bounded read (:func:`read_user_text`), JSON without NaN, infinities or huge
    integers (:func:`load_user_json`); malformed JSON named with its line and column."""
    what = f"model config {shown(str(path))}"
    text = read_user_text(path, "model config")
    try:
        return load_user_json(text, what)
    except json.JSONDecodeError as err:
        raise InvalidValueError(f"{what} is not valid JSON: line {err.lineno} column {err.colno}: {err.msg}") from err
