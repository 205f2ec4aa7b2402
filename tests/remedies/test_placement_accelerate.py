"""The torch-free device_map placement (``remedies.auto_device_map`` over the module tree) against accelerate itself
(``get_balanced_memory`` + ``infer_auto_device_map`` on the fp16 meta model, ``placement.accelerate_device_map``):
the same modules on the same devices, in the same order, and the same placements of the plan's setups."""

import random

import pytest

from oomlab.core.models import known_models, load_model
from oomlab.core.module_tree import module_tree
from oomlab.core.setup import make_setup
from oomlab.remedies import auto_device_map as ours
from oomlab.remedies import placement
from oomlab.remedies.placement import NO_SPLIT, accelerate_device_map, auto_device_map, module_sizes, place_device_map


def budgets(total: int, seed: int) -> list[dict[int, int]]:
    """GPU budgets around the model's size: most spill to the CPU, some fit one GPU, a few GPUs get nothing."""
    rng = random.Random(seed)
    rows = [{i: int(total * share / gpus * (1 + 0.3 * rng.random())) for i in range(gpus)}
            for gpus in (1, 2, 3, 4, 8) for share in (0.02, 0.1, 0.3, 0.55, 1.1, 2.0)]
    return rows + [{0: 0, 1: 0}, {0: total, 1: 0}]  # nothing anywhere; one GPU given nothing


@pytest.mark.heavy
@pytest.mark.parametrize("name", known_models())
def test_every_shipped_model_placed_as_accelerate_places_it(name):
    """Every shipped model over 1 to 8 GPUs of 32 budgets: accelerate's device map, key for key and in its order."""
    spec = load_model(name)
    for max_memory in budgets(module_sizes(spec)[""], seed=len(name)):
        assert list(auto_device_map(spec, max_memory).items()) == list(accelerate_device_map(spec, max_memory).items())


@pytest.mark.parametrize("name", ["llama-13b", "gemma-2b", "falcon-7b"])
def test_module_sizes_are_accelerates(name):
    """compute_module_sizes in fp16 (RoPE's fp32 buffers sized at 2 bytes, a tied weight once), key for key in order."""
    from accelerate.utils import compute_module_sizes

    model = placement._meta_model(load_model(name))
    assert list(module_sizes(load_model(name)).items()) == list(compute_module_sizes(model, dtype="float16").items())


@pytest.mark.parametrize(("name", "gpus", "share"), [
    ("llama-13b", 4, 0.3),  # the seed's: four GPUs each capped to the model's share plus a decoder layer
    ("gemma-2b", 3, 0.5),  # no decoder layer class in NO_SPLIT: the mean final module is the buffer
    ("llama-2-70b", 1, 2.0),  # one GPU: kept as given
])
def test_balanced_memory_is_accelerates(name, gpus, share):
    """get_balanced_memory gives each GPU what accelerate gives it."""
    from accelerate.utils import get_balanced_memory

    spec = load_model(name)
    given = {i: int(module_sizes(spec)[""] * share) for i in range(gpus)}
    with placement._memoised_sizes():
        theirs = get_balanced_memory(placement._meta_model(spec), max_memory=dict(given),
                                     no_split_module_classes=list(NO_SPLIT), dtype="float16")
    assert ours.get_balanced_memory(module_tree(spec), module_sizes(spec), dict(given), list(NO_SPLIT)) == theirs


SETUPS = [
    dict(model="llama-13b", gpu="t4", gpus=4, method="lora", checkpointing=True),  # the seed's 4 x T4: fits
    dict(model="llama-13b", gpu="t4", gpus=2, method="lora", checkpointing=True),  # spills to the CPU
    dict(model="llama-2-70b", gpu="a100-80gb", gpus=8, method="qlora"),  # a 70B over 8 GPUs
    dict(model="llama-2-70b", gpu="a100-80gb", gpus=4, method="full"),  # a 70B that spills
    dict(model="llama-2-7b", gpu="a100-80gb", gpus=1, method="lora"),  # a 7B whole on one GPU ({"": 0})
    dict(model="gemma-2b", gpu="t4", gpus=2, method="full"),  # tied embeddings
    dict(model="llama-3.2-1b", gpu="t4", gpus=3, method="lora"),  # tied, a Llama decoder kept whole
    dict(model="qwen2.5-0.5b", gpu="t4", gpus=4, method="full", checkpointing=True),  # tied
    dict(model="falcon-7b", gpu="a10g", gpus=2, method="lora"),  # tied, FalconDecoderLayer split
    dict(model="llama-2-7b", gpu="t4", gpus=2, method="full", batch=16, seq=4096),  # everything on the CPU
]


@pytest.mark.parametrize("kwargs", SETUPS, ids=lambda k: f"{k['model']}-{k['gpu']}x{k['gpus']}-{k['method']}")
def test_placement_is_accelerates(monkeypatch, kwargs):
    """The plan's placement with accelerate's own device map in place of the torch-free one: the same, every GPU's
    modules, layers, bytes and peak, and the spill."""
    setup = make_setup(**kwargs)
    torch_free = place_device_map(setup)
    monkeypatch.setattr(placement, "auto_device_map", accelerate_device_map)
    assert place_device_map(setup).to_dict() == torch_free.to_dict()
