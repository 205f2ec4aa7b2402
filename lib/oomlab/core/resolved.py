"""Model configs as transformers' config classes resolve them: through the config class itself
(:func:`config_object`, for a user's ``config.json``), or, for the shipped specs, from the committed table of what
that class resolved (``specs/models-resolved.json``), so the analytic estimate of a shipped model imports no
transformers (and no torch).

The table is generated, never edited: ``python -m oomlab.core.resolved > lib/oomlab/specs/models-resolved.json``
prints it from the installed transformers; ``tests/core/test_resolved.py`` re-derives it and fails when it is stale.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any

from oomlab.core.errors import InvalidValueError
from oomlab.core.paths import MODEL_SPECS_DIR, SPECS_DIR
from oomlab.core.quiet import quiet_libraries
from oomlab.core.user_input import shown

RESOLVED_CONFIGS = SPECS_DIR / "models-resolved.json"
# config.json keys that are not config-class arguments: the model_type picks the class; auto_map names custom code
# oomlab does not run (a supported family's own classes are used instead, as trust_remote_code=False does)
_NOT_CONFIG_FIELDS = ("model_type", "auto_map")
# Names older transformers mapped onto the config (FalconConfig.attribute_map in transformers 4.x); transformers 5
# keeps them as unknown attributes and silently uses its defaults (71 heads, 32 layers) instead: mapped here
LEGACY_KEYS = {"falcon": {"n_head": "num_attention_heads", "n_layer": "num_hidden_layers", "n_embed": "hidden_size"}}
# PretrainedConfig's own bookkeeping, the same for every model and read by no estimate: left out of the table
_BOOKKEEPING = ("transformers_version", "_name_or_path", "id2label", "label2id", "output_hidden_states",
                "output_attentions", "return_dict", "chunk_size_feed_forward", "problem_type", "architectures")


def config_object(model_type: str, raw: Mapping[str, Any]) -> Any:
    """``AutoConfig.for_model(model_type, **fields)`` over a copy of a ``config.json``'s fields (``_``-keys and the
    custom-code ``auto_map`` left out), transformers' chatter silenced.  A copy: transformers writes into the nested
    dicts it is given (``rope_scaling`` gains ``rope_theta``), which would change the spec's own fields and so their
    digest, the key of every committed table."""
    from transformers import AutoConfig  # the trace, the instruments and user config paths only

    fields = copy.deepcopy({k: v for k, v in raw.items() if not k.startswith("_") and k not in _NOT_CONFIG_FIELDS})
    for legacy, key in LEGACY_KEYS.get(model_type, {}).items():
        if legacy in fields:
            value = fields.pop(legacy)
            if fields.setdefault(key, value) != value:
                raise InvalidValueError(f"config.json gives {legacy}={shown(value)} and {key}={shown(fields[key])}")
    with quiet_libraries():
        return AutoConfig.for_model(model_type, **fields)


class ResolvedConfig:
    """The fields of a transformers config object, read as attributes (``cfg.hidden_size``), without transformers:
    what :mod:`oomlab.core.layouts` and the estimate read off a config. A field the class did not resolve raises
    ``AttributeError``, so ``getattr(cfg, name, default)`` behaves as on the config object."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_fields", MappingProxyType(dict(fields)))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"resolved {self._fields.get('model_type')} config has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a resolved config is read-only: use ModelSpec.hf_config() for one to change")

    def to_dict(self) -> dict[str, Any]:
        return dict(self._fields)

    def __repr__(self) -> str:
        return f"ResolvedConfig({self._fields.get('model_type')!r}, {len(self._fields)} fields)"


def resolved_fields(model_type: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """What the config class resolves from a ``config.json``'s fields (defaults and derived fields filled in), as JSON
    would store it, PretrainedConfig's bookkeeping left out."""
    cfg = config_object(model_type, raw)
    fields = {k: v for k, v in cfg.to_dict().items() if k not in _BOOKKEEPING}
    # what the object answers beyond its dict: the class's aliases (Mixtral's num_experts) and properties (Falcon's
    # head_dim)
    names = [*getattr(type(cfg), "attribute_map", {}),
             *(k for k, v in vars(type(cfg)).items() if isinstance(v, property))]
    fields.update({name: getattr(cfg, name) for name in names})
    return json.loads(json.dumps(fields, sort_keys=True))


def config_digest(raw: Mapping[str, Any]) -> str:
    """SHA-256 of a ``config.json``'s fields as canonical JSON: which fields a resolution was derived from."""
    return hashlib.sha256(json.dumps(dict(raw), sort_keys=True).encode()).hexdigest()


@cache
def _table() -> Mapping[str, Any]:
    return json.loads(RESOLVED_CONFIGS.read_text())


def shipped_resolved(name: str, raw: Mapping[str, Any]) -> ResolvedConfig | None:
    """The committed resolution of shipped spec ``name``, if its ``config.json`` fields are still those it was
    derived from (``None`` otherwise: the caller resolves through transformers)."""
    entry = _table()["models"].get(name)
    if entry is None or entry["config_sha256"] != config_digest(raw):
        return None
    return ResolvedConfig(entry["resolved"])


def derive_table() -> dict[str, Any]:
    """The table, derived afresh through the installed transformers from every shipped ``config.json``."""
    import transformers

    models = {}
    for path in sorted(MODEL_SPECS_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        models[path.stem] = {"config_sha256": config_digest(raw), "resolved": resolved_fields(raw["model_type"], raw)}
    return {"_source": f"derived by oomlab.core.resolved.derive_table with transformers {transformers.__version__}: "
                       "each shipped config.json and what AutoConfig.for_model resolves from it",
            "models": models}


if __name__ == "__main__":
    json.dump(derive_table(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
