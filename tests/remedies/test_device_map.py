"""oomlab's device_map placement (oomlab.remedies.placement) against accelerate's own infer_auto_device_map, run here
on a meta model built straight from the config's fields with transformers (none of oomlab's model or size code).

The two must agree module for module, given the same per-GPU budget (``max_memory``, which oomlab scales from the
training budget); the placed bytes are recounted from the parameters themselves.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from oomlab.budget.result import MemCategory
from oomlab.core.paths import MODEL_SPECS_DIR
from oomlab.core.setup import make_setup
from oomlab.remedies.placement import place_device_map

PARAMS_13B = 13_015_864_320  # llama-13b's parameters, hand-checked: 40 layers + 2 x 32000 x 5120 + norm


def accelerate_meta_model(name: str):
    """``LlamaForCausalLM`` in fp16 on ``meta`` from the shipped spec's JSON fields, transformers only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {k: v for k, v in json.loads((MODEL_SPECS_DIR / f"{name}.json").read_text()).items()
              if not k.startswith("_")}
    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**fields)).to(torch.float16)


def accelerate_map(model, max_memory: dict) -> dict:
    """What ``from_pretrained(device_map="auto", max_memory=...)`` does: balance, then infer (accelerate alone)."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    no_split = ["LlamaDecoderLayer"]
    balanced = get_balanced_memory(model, max_memory=dict(max_memory), no_split_module_classes=no_split,
                                   dtype="float16")
    balanced = {k: min(int(v), max_memory[k]) for k, v in balanced.items() if k in max_memory}
    return infer_auto_device_map(model, max_memory={**balanced, "cpu": 1 << 62}, no_split_module_classes=no_split,
                                 dtype="float16")


@pytest.fixture(scope="module")
def model():
    return accelerate_meta_model("llama-13b")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("gpu", "gpus", "method"),
    [
        ("t4", 4, "lora"),  # the seed's hardware: fits over 4 GPUs
        ("t4", 2, "lora"),  # spills to the CPU
        ("a10g", 3, "qlora"),  # an odd count
        ("a100-80gb", 2, "lora"),  # the whole model fits one GPU
    ],
)
def test_placement_is_accelerates(model, gpu: str, gpus: int, method: str) -> None:
    """Module for module, oomlab places what accelerate places given the same max_memory; spilled modules too."""
    setup = make_setup("llama-13b", gpu, gpus=gpus, method=method, checkpointing=True)
    ours = place_device_map(setup)
    theirs = accelerate_map(model, {int(k): int(v) for k, v in ours.max_memory.items()})
    by_device = defaultdict(list)
    for name, device in theirs.items():
        by_device[device].append(name)
    assert [list(g.modules) for g in ours.gpus] == [by_device.get(i, []) for i in range(gpus)]
    assert sorted(ours.spilled) == sorted(n for d, ns in by_device.items() if not isinstance(d, int) for n in ns)


def recount(model, names: tuple[str, ...]) -> int:
    """Bytes of the parameters (fp16) and buffers (their own dtype: RoPE's inv_freq stays fp32) under the placed
    module names, each tensor once."""
    total = 0
    for tname, t in [*model.named_parameters(), *model.named_buffers()]:
        if any(n == "" or tname == n or tname.startswith(n + ".") for n in names):
            total += t.numel() * t.element_size()
    return total


def test_placed_bytes_layers_and_head_recounted(model) -> None:
    """The seed's 4 T4: each GPU's weight bytes from the parameters, 40 layers once in order, the head on one GPU."""
    setup = make_setup("llama-13b", "t4", gpus=4, method="lora", checkpointing=True)
    ours = place_device_map(setup)
    assert not ours.spilled
    assert [g.weight_bytes for g in ours.gpus] == [recount(model, g.modules) for g in ours.gpus]
    assert sum(g.weight_bytes for g in ours.gpus) == 2 * PARAMS_13B + 64 * 4  # + model.rotary_emb.inv_freq (fp32)
    layers = [i for g in ours.gpus for i in g.layers]
    assert layers == list(range(40))
    for g in ours.gpus:
        names = {f"model.layers.{i}" for i in g.layers}
        assert names == {n for n in g.modules if n.startswith("model.layers.")}
    heads = [g.device for g in ours.gpus if g.holds_lm_head]
    assert heads == [next(g.device for g in ours.gpus if "lm_head" in g.modules)]
    # each GPU's training peak is under its capacity (the remedy fits) and above its weights
    for g in ours.gpus:
        assert g.weight_bytes < g.peak_bytes <= setup.gpu.total_memory_bytes


@pytest.mark.parametrize(
    ("placed", "holds"),
    [
        (("lm_head",), True),
        (("",), True),  # accelerate's {"": 0}: the whole model on one GPU
        (("model.norm", "model.rotary_emb"), False),  # the last layers' neighbours, not the head
        (("model.layers.39", "model.norm"), False),
        (("model.embed_tokens", "model.layers.0"), False),
    ],
)
def test_head_gpu_is_where_lm_head_is(model, placed: tuple[str, ...], holds: bool) -> None:
    """The logits and the loss go on the GPU holding the LM head itself (or the whole model), not its neighbours."""
    from oomlab.remedies.placement import holds_head

    sizes = {name: 1 for name, _ in model.named_modules()}
    assert holds_head(placed, sizes) is holds


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_placement_with_every_module_on_the_cpu_is_budgeted_and_said_so() -> None:
    """When the logits alone outweigh each GPU, accelerate maps the whole model to the CPU ({"": "cpu"}); the
    re-budget of that placement (the plan's micro-batch search) used to raise ``max() arg is an empty sequence``
    (gemma-2-9b on 2 x RTX 4090 stopped notebook 03). Each GPU then holds only the memory outside PyTorch, and the
    remedy is refused as the whole model on the CPU."""
    from dataclasses import replace

    from oomlab.budget.estimator import estimate_setup
    from oomlab.core.choices import Route, Strategy
    from oomlab.remedies.placement import replace_peak
    from oomlab.remedies.remedy import Evaluator, reason

    setup = make_setup(model="llama-2-7b", gpu="t4", gpus=2, strategy="single", method="full", batch=16, seq=4096)
    placement = place_device_map(setup)
    assert placement.spilled == ("",) and not any(g.modules for g in placement.gpus)
    result = estimate_setup(replace(setup, strategy=Strategy.SINGLE, gpus=1))
    assert replace_peak(placement, result) == result.components[MemCategory.OUTSIDE_PYTORCH]
    ev = Evaluator(192 << 30, None)(setup, placement, Route.DEVICE_MAP)
    assert not ev.gpu_fits
    assert reason(ev, setup, 192 << 30).startswith("device_map puts the whole model on the CPU")
