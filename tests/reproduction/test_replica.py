"""The shipped replica figures (``specs/replica-reserved.json``) are what the walk gives."""

import json

from oomlab.reproduction.replica import REPLICA_RESERVED, derive_table, replica_reserved_bytes
from oomlab.reproduction.walk import unlimited_walk

REGENERATE = ".venv/bin/python -m oomlab.reproduction.replica > lib/oomlab/specs/replica-reserved.json"


def test_committed_table_equals_a_fresh_walk():
    """Every shipped model's fp16 replica, walked afresh, reserves the committed figure."""
    assert json.loads(REPLICA_RESERVED.read_text())["models"] == derive_table()["models"], \
        f"stale: regenerate with {REGENERATE}"


def test_seed_replica_reserves_what_notebook_01_reproduced():
    """llama-13b in float16: 24.37 GiB reserved (26,161,971,200 bytes), from the table and from the walk alike."""
    assert replica_reserved_bytes("llama-13b", "float16") == unlimited_walk("llama-13b", "float16")[-1].reserved_bytes \
        == 26_161_971_200


def test_model_without_a_shipped_figure_is_walked(tmp_path):
    """A dtype or a config.json the table lacks is walked."""
    assert replica_reserved_bytes("llama-13b", "float32") == unlimited_walk("llama-13b", "float32")[-1].reserved_bytes
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}))
    assert replica_reserved_bytes(str(config), "float16") == unlimited_walk(str(config), "float16")[-1].reserved_bytes
