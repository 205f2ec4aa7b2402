"""The torch-free load walk (``reproduction.apply_walk``) against the traced one: step for step what PyTorch's own
``Module._apply`` records on the meta model (``reproduction.traced_walk``), and the replica's figures what the simulated
reproduction (``reproduce(device="simulated")``) gives."""

import json
from dataclasses import fields

import pytest

from oomlab.core.models import known_models
from oomlab.reproduction.allocator import CachingAllocator
from oomlab.reproduction.apply_walk import (
    MovedTensor,
    ReplicaMove,
    move_replica,
    replay,
    tree_unlimited_walk,
)
from oomlab.reproduction.replay import reproduce
from oomlab.reproduction.steps import TensorKind
from oomlab.reproduction.traced_walk import traced_unlimited_walk

DTYPES = ("float16", "bfloat16", "float32")
# every field ReplicaMove shares with ReproduceResult (the traceback, the frames, the device are the traced run's)
SHARED = [f.name for f in fields(ReplicaMove) if f.name != "message_format"]


@pytest.mark.heavy
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", known_models())
def test_every_shipped_walk_is_the_traced_walk(name, dtype):
    """Every shipped model in every dtype: the same tensors, in the same order, with the same allocator figures."""
    assert tree_unlimited_walk(name, dtype) == traced_unlimited_walk(name, dtype)


@pytest.mark.parametrize(("name", "dtype"), [
    ("llama-13b", "float16"),  # the seed's
    ("gemma-2b", "bfloat16"),  # a tied embedding, moved once under its first name
    ("qwen1.5-moe-a2.7b", "float32"),  # experts and a shared expert
])
def test_walk_is_the_traced_walk(name, dtype):
    """A few models in the fast lane (every one, in every dtype, in the heavy lane)."""
    assert tree_unlimited_walk(name, dtype) == traced_unlimited_walk(name, dtype)


@pytest.mark.parametrize(("name", "dtype", "gpu"), [
    ("llama-13b", "float16", "t4"),  # the seed: fails, in the seed's torch 2.0 wording
    ("llama-13b", "float32", "t4"),  # fails earlier, in today's wording
    ("llama-7b", "float16", "t4"),  # fits
    ("llama-2-70b", "bfloat16", "a100-80gb"),  # a 70B: fails
    ("gemma-2b", "float16", "t4"),  # tied embedding, fits
    ("falcon-7b", "float32", "a10g"),  # tied embedding, fails
    ("qwen2.5-0.5b", "float16", "t4"),  # tied embedding, small
])
def test_replica_move_is_the_simulated_reproduction(name, dtype, gpu):
    """Each figure ``check`` reads off a load, and every other but the traceback, is the simulated reproduction's."""
    ours = move_replica(name, dtype, gpu)
    traced = reproduce(model=name, dtype=dtype, gpu=gpu, device="simulated")
    assert {f: getattr(ours, f) for f in SHARED} == {f: getattr(traced, f) for f in SHARED}
    assert ours.message_format.value == traced.message_format
    assert ours.moved_fraction == traced.moved_fraction


def test_seed_replica_fails_as_the_seed():
    """llama-13b in fp16 on a T4: the seed's message, at layer 23's gate projection; 24.37 GiB reserved for the whole
    replica."""
    move = move_replica("llama-13b", "float16", "t4")
    assert move.raised and move.model_reserved_bytes == 26_161_971_200
    assert move.failing_tensor.name == "model.layers.23.mlp.gate_proj.weight"
    assert move.message.startswith(
        "CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; 14.16 GiB already "
        "allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch)")


def test_config_path_walk_is_the_traced_walk(tmp_path):
    """A config.json the table lacks is built on meta, and walks as torch walks it."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}))
    for dtype in DTYPES:
        assert tree_unlimited_walk(str(config), dtype) == traced_unlimited_walk(str(config), dtype)


def test_zero_byte_tensor_is_recorded_not_allocated():
    """As the traced mode: a tensor of no bytes is a step, and the allocator is not asked."""
    allocator = CachingAllocator(1 << 30)
    walk = replay((MovedTensor("empty", TensorKind.BUFFER, (0,), "float32", 0),
                   MovedTensor("w", TensorKind.PARAMETER, (4,), "float16", 4)), allocator)
    assert [(s.name, s.nbytes, s.reserved_bytes, s.moved_parameters) for s in walk.steps] == \
        [("empty", 0, 0, 0), ("w", 8, 2 << 20, 4)]
    assert walk.failure is None and walk.message is None
