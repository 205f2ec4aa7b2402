"""A replica's reserved bytes are the end of the traced walk (PyTorch's own ``Module._apply`` on the meta model)."""

import json

import pytest

from oomlab.core.models import known_models
from oomlab.reproduction.replica import replica_reserved_bytes
from oomlab.reproduction.traced_walk import traced_unlimited_walk


@pytest.mark.heavy
@pytest.mark.parametrize("name", known_models())
def test_every_shipped_replica_reserves_what_the_traced_walk_does(name):
    """Every shipped model's fp16 replica (the plan's configured row) reserves what the traced walk ends at."""
    assert replica_reserved_bytes(name, "float16") == traced_unlimited_walk(name, "float16")[-1].reserved_bytes


def test_seed_replica_reserves_what_notebook_01_reproduced():
    """llama-13b in float16: 24.37 GiB reserved (26,161,971,200 bytes), torch-free and traced alike."""
    assert replica_reserved_bytes("llama-13b", "float16") == \
        traced_unlimited_walk("llama-13b", "float16")[-1].reserved_bytes == 26_161_971_200


def test_other_dtype_and_config_path(tmp_path):
    """Another dtype, and a config.json the tables lack (built on meta), reserve what the traced walk does."""
    assert replica_reserved_bytes("llama-13b", "float32") == \
        traced_unlimited_walk("llama-13b", "float32")[-1].reserved_bytes
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}))
    assert replica_reserved_bytes(str(config), "float16") == \
        traced_unlimited_walk(str(config), "float16")[-1].reserved_bytes
