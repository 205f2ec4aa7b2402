"""The committed resolution of the shipped specs (``specs/models-resolved.json``): re-derived through transformers,
and the specs built from it equal to those built through the config class."""

import json

import pytest

from oomlab.core import models
from oomlab.core.models import known_models, load_model
from oomlab.core.resolved import RESOLVED_CONFIGS, ResolvedConfig, derive_table, shipped_resolved

REGENERATE = ".venv/bin/python -m oomlab.core.resolved > lib/oomlab/specs/models-resolved.json"


def test_committed_table_equals_a_fresh_derivation():
    """Every shipped config.json's resolution, as the installed transformers derives it, is the committed one."""
    committed = json.loads(RESOLVED_CONFIGS.read_text())["models"]
    assert committed == derive_table()["models"], f"stale: regenerate with {REGENERATE}"


@pytest.mark.parametrize("name", known_models())
def test_spec_from_the_table_equals_the_spec_from_the_config_class(name):
    """A shipped spec read from the table has the geometry the config class gives (fields, layers, counts)."""
    path = models.MODEL_SPECS_DIR / f"{name}.json"
    raw = json.loads(path.read_text())
    from_table = load_model(name)
    assert isinstance(from_table.resolved, ResolvedConfig)
    through_class = models._model_from_dict(name, raw, str(path))
    assert not isinstance(through_class.resolved, ResolvedConfig)
    assert from_table == through_class
    assert from_table.layer_layouts == through_class.layer_layouts
    assert (from_table.head_dim, from_table.q_dim, from_table.kv_dim, from_table.sliding_window) == \
        (through_class.head_dim, through_class.q_dim, through_class.kv_dim, through_class.sliding_window)
    assert from_table.num_parameters == through_class.num_parameters
    for field in ("final_logit_softcapping", "layer_types", "max_position_embeddings"):
        assert getattr(from_table.resolved, field, None) == getattr(through_class.resolved, field, None)


def test_changed_config_is_not_read_from_the_table():
    """A config.json whose fields differ from those the table was derived from is resolved afresh."""
    raw = json.loads((models.MODEL_SPECS_DIR / "llama-13b.json").read_text())
    assert shipped_resolved("llama-13b", raw) is not None
    assert shipped_resolved("llama-13b", {**raw, "num_hidden_layers": 2}) is None
    assert shipped_resolved("no-such-model", raw) is None


def test_resolved_config_reads_like_the_config_object():
    """Attribute access; a missing field is an AttributeError (so getattr's default applies); read-only."""
    cfg = ResolvedConfig({"model_type": "llama", "hidden_size": 8})
    assert cfg.hidden_size == 8 and getattr(cfg, "head_dim", None) is None
    with pytest.raises(AttributeError, match="resolved llama config has no field 'head_dim'"):
        _ = cfg.head_dim
    with pytest.raises(AttributeError, match="read-only"):
        cfg.hidden_size = 9
