"""The analytic budget's terms: published constants, parameter counts, sharding, phases, bad input."""

import pytest

from oomlab.budget.api import estimate
from oomlab.budget.deepspeed_layout import flat_partition
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory, Phase, Source
from oomlab.budget.states import (
    gradients_on_gpu,
    lora_parameters,
    optimizer_on_gpu,
    optimizer_temp_bytes,
    weight_bytes_total,
    weights_on_gpu,
)
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.setup import make_setup

N13 = 13_015_864_320
ROTARY = 512  # llama-13b's fp32 inv_freq and original_inv_freq buffers (2 x 4 B x head_dim / 2), not cast by DeepSpeed
STATES = (MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.MASTER_WEIGHTS, MemCategory.OPTIMIZER_STATE)


def _optimizer_step(setup) -> dict[MemCategory, int]:
    """What estimate() holds in the optimizer step."""
    return dict(estimate_setup(setup, 0).phases[Phase.OPTIMIZER])


def test_zero_paper_16_bytes_per_parameter() -> None:
    """ZeRO-style mixed-precision Adam on one GPU, as estimate() holds it in the step: 2 + 2 + 4 + 8 = 16 bytes per
    parameter (and the rotary buffers DeepSpeed leaves in fp32)."""
    s = make_setup(gpus=1, model="llama-13b", gpu="a100-80gb", strategy="zero2", precision="fp16-mixed")
    step = _optimizer_step(s)
    assert [step[c] for c in STATES] == [2 * N13 + ROTARY, 2 * N13, 4 * N13, 8 * N13]


def test_torch_autocast_keeps_fp32_weights() -> None:
    """torch autocast: fp32 weights and gradients, 8 bytes of Adam state; no separate master copy."""
    s = make_setup(gpus=1, model="llama-13b", gpu="a100-80gb", precision="fp16-mixed")
    assert (weights_on_gpu(s), gradients_on_gpu(s), optimizer_on_gpu(s)) == (4 * N13, 4 * N13, 8 * N13)
    step = _optimizer_step(s)
    assert [step.get(c, 0) for c in STATES] == [4 * N13, 4 * N13, 0, 8 * N13]


@pytest.mark.parametrize(("gpus", "expected"), [(1, 2 * N13 + 18 * N13), (4, 2 * N13 + 18 * N13 // 4)])
def test_zero2_optimizer_phase_is_deepspeed_estimator_plus_the_flat_copy(gpus: int, expected: int) -> None:
    """Model states at the ZeRO-2 optimizer step: DeepSpeed's 2N + 18N/gpus (its cold estimator) plus the half flat
    copy of the gradient partition that step() makes before converting it to fp32 (2N/gpus), the rotary buffers, and
    the whole parameters the largest rank's gradient partition overlaps beyond its share (grads_in_partition)."""
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    s = make_setup(model="llama-13b", gpu="a100-80gb", gpus=gpus, strategy="zero2", precision="fp16-mixed")
    step = _optimizer_step(s)
    ours = sum(step[c] for c in STATES) + step[MemCategory.WORKSPACE]
    _, deepspeed_gpu = estimate_zero2_model_states_mem_needs(N13, num_gpus_per_node=gpus, cpu_offload=False)
    assert deepspeed_gpu == expected
    part = flat_partition(s)
    assert part.aligned == N13  # no alignment padding: N is a multiple of 2 x gpus
    assert ours - deepspeed_gpu - 2 * N13 // gpus == ROTARY + 2 * (part.in_partition - part.partition)


def test_non_adamw_and_offload_have_no_optimizer_temporary() -> None:
    """torch's foreach AdamW holds a state-sized sqrt; fused AdamW and SGD none, nor an offloaded (HOST) step."""
    kw = {"model": "llama-13b", "gpu": "a100-80gb", "gpus": 4, "precision": "bf16-mixed"}
    assert optimizer_temp_bytes(make_setup(strategy="fsdp", **kw)) == 8 * N13 // 4 // 2
    for strategy, optimizer in (("fsdp", "adamw-fused"), ("fsdp", "sgd"), ("fsdp-offload", "adamw"),
                                ("fsdp2-offload", "adamw")):
        assert optimizer_temp_bytes(make_setup(strategy=strategy, optimizer=optimizer, **kw)) == 0


def test_fsdp_against_deepspeed_zero3() -> None:
    """FSDP full shard keeps 16 B/param/GPU of fp32 states; DeepSpeed ZeRO-3 counts 18 (+2 for half copies).

    DeepSpeed's 18 = 2 half gradients + 4 fp32 gradients + 4 fp32 params + 8 Adam, all partitioned, plus 4 B
    per parameter of the largest layer; torch FSDP2 with autocast keeps fp32 params, fp32 grads and Adam
    (16/gpus) and all-gathers layers in fp32.  The difference is the 2 B/param/gpus of DeepSpeed's half
    gradient partition.
    """
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    s = make_setup(model="llama-13b", gpu="t4", gpus=4, strategy="fsdp", precision="fp16-mixed")
    ours = weights_on_gpu(s) + gradients_on_gpu(s) + optimizer_on_gpu(s)
    layer = 317_204_480
    _, ds_gpu, _ = estimate_zero3_model_states_mem_needs(N13, layer, num_gpus_per_node=4, cpu_offload=False)
    assert ds_gpu - 4 * layer - ours == pytest.approx(2 * N13 / 4, abs=8)


def test_qlora_weights_at_4127_bits() -> None:
    """QLoRA: NF4 with double quantization, 4.127 bits per quantized weight; the rest in half where peft does not
    upcast it (before peft 0.4.0's prepare_model_for_kbit_training; the upcast: tests/budget/test_qlora_upcast.py)."""
    s = make_setup(gpus=1, model="llama-7b", gpu="t4", method="qlora", lora_targets="q_proj,v_proj",
                   versions={"peft": "0.3.0"})
    quantized = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert weight_bytes_total(s) == round(quantized * 4.127 / 8) + 2 * (6_738_415_616 - quantized) + 4 * 4_194_304


@pytest.mark.parametrize(
    ("targets", "count"),
    [("q_proj,v_proj", 4_194_304), ("q_proj,k_proj,v_proj,o_proj", 8_388_608)],  # peft's print_trainable_parameters
)
def test_lora_parameter_count_llama_7b(targets: str, count: int) -> None:
    """r=8 adapters on llama-7b count what peft reports."""
    assert lora_parameters(make_setup(gpus=1, model="llama-7b", gpu="t4", method="lora", lora_targets=targets)) == count


def test_gqa_lora_counts_narrow_kv() -> None:
    """With 8 KV heads, k/v adapters of llama-2-70b are r * (8192 + 1024)."""
    s = make_setup(gpus=1, model="llama-2-70b", gpu="h100-80gb", method="lora", lora_targets="k_proj", lora_rank=16)
    assert lora_parameters(s) == 80 * 16 * (8192 + 1024)


def test_fsdp_divides_model_states_by_world_size() -> None:
    """Full shard: weights, gradients and optimizer state each / gpus."""
    one = make_setup(model="llama-13b", gpu="t4", gpus=1, strategy="fsdp")
    four = make_setup(model="llama-13b", gpu="t4", gpus=4, strategy="fsdp")
    for term in (weights_on_gpu, gradients_on_gpu, optimizer_on_gpu):
        assert term(four) == -(-term(one) // 4)


def test_offload_leaves_no_states_on_gpu() -> None:
    """fsdp-offload keeps parameters, gradients and optimizer state on the host."""
    r = estimate(model="llama-13b", gpu="t4", gpus=4, strategy="fsdp-offload", method="full")
    assert MemCategory.OPTIMIZER_STATE not in r.components and MemCategory.WEIGHTS not in r.components
    assert r.host_ram_bytes > 16 * N13 // 1


def test_seed_configuration_does_not_fit() -> None:
    """The seed: full fine-tuning of a full replica per T4 needs far more than 14.75 GiB."""
    r = estimate(model="llama-13b", gpu="t4", gpus=4, strategy="ddp", method="full", precision="fp16-mixed")
    assert not r.fits and r.per_gpu_peak_bytes > 10 * r.capacity_bytes
    assert r.peak_phase is Phase.OPTIMIZER


def test_peak_is_a_phase_total_not_a_sum_of_maxima() -> None:
    """The allocated peak equals the largest phase total."""
    r = estimate(model="llama-7b", gpu="a100-80gb", method="lora", seq=2048, batch=2)
    totals = {p: sum(c.values()) for p, c in r.phases.items()}
    assert r.allocated_peak_bytes == max(totals.values())
    assert r.peak_phase is max(totals, key=totals.get)


def test_lora_peaks_in_backward_full_in_optimizer() -> None:
    """LoRA's peak is in backward (activations), full fine-tuning's in the optimizer step."""
    assert estimate(model="llama-7b", gpu="a100-80gb", method="lora").peak_phase is Phase.BACKWARD
    assert estimate(model="llama-7b", gpu="a100-80gb", method="full", seq=512).peak_phase is Phase.OPTIMIZER


def test_checkpointing_cuts_activations() -> None:
    """Checkpointing keeps one hidden state per layer instead of the whole inventory."""
    kw = dict(model="llama-13b", gpu="a100-80gb", method="lora", seq=2048)
    plain = estimate(**kw).phases[Phase.BACKWARD][MemCategory.ACTIVATIONS]
    ckpt = estimate(checkpointing=True, **kw).phases[Phase.BACKWARD][MemCategory.ACTIVATIONS]
    assert ckpt < plain / 5


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"precision": "bf16-mixed"}, InvalidValueError, "precision 'bf16-mixed' needs bfloat16, which the Tesla T4"),
        ({"method": "qlora", "precision": "fp32"}, InvalidValueError, "precision 'fp32' is not a QLoRA setup"),
        ({"method": "lora", "lora_rank": 0}, InvalidValueError, "invalid LoRA rank 0; must be >= 1"),
        ({"strategy": "zero4"}, UnknownNameError, "unknown strategy 'zero4'; known: ddp, fsdp, fsdp-offload"),
        ({"optimizer": "adam"}, UnknownNameError,
         "unknown optimizer 'adam'; known: adamw, adamw-8bit, adamw-fused, adamw-hf, sgd"),
        ({"batch": 0}, InvalidValueError, "invalid batch 0; must be an integer >= 1"),
        ({"source": "measured"}, UnknownNameError, "unknown source 'measured'; known: analytic, traced"),
        ({"method": "lora", "lora_targets": "qkv"}, UnknownNameError, "unknown LoRA target module 'qkv'"),
    ],
)
def test_invalid_setups_say_why(kwargs, error, message) -> None:
    """Invalid combinations are refused with the reason."""
    with pytest.raises(error, match=message):
        estimate(model="llama-13b", gpu="t4", **kwargs)


def test_top_level_estimate_api() -> None:
    """``oomlab.estimate`` is the documented entry point and returns the documented fields."""
    import oomlab

    r = oomlab.estimate(model="llama-13b", gpu="t4", gpus=4, nodes=1, strategy="fsdp", method="lora",
                        precision="fp16-mixed", optimizer="adamw", batch=1, seq=2048, checkpointing=True,
                        attention="sdpa", lora_rank=8, lora_targets=("q_proj", "v_proj"), source="analytic")
    for field in ("per_gpu_peak_bytes", "allocated_peak_bytes", "components", "host_ram_bytes", "capacity_bytes",
                  "fits", "headroom_bytes", "source"):
        assert hasattr(r, field), field
    assert r.fits and r.source is Source.ANALYTIC and r.per_gpu_peak_bytes > r.allocated_peak_bytes


def test_qlora_dequantized_weight_inside_a_layer_backward() -> None:
    """QLoRA's dequantized h x i weight counts inside a recomputed layer's backward where h exceeds the tokens
    (13B at 2,048 tokens), and not where the tokens exceed h (the tiny measured rows)."""
    from oomlab.budget import activations as act
    from oomlab.budget import workspace
    from oomlab.budget.step import tiny_setup

    big = make_setup(gpus=1, model="llama-13b", gpu="a100-80gb", method="qlora", precision="bf16-mixed", seq=2048,
                     checkpointing=True, versions={"peft": "0.3.0"})  # no fp32 head copy held at backward's start
    spec = big.model
    tmp = workspace.recompute_gradient_bytes(big)
    assert workspace.dequant_bytes(big) == 2 * spec.hidden_size * spec.intermediate_size + 4 * (
        spec.hidden_size * spec.intermediate_size // 64)
    expected = tmp - 2 * 2048 * spec.intermediate_size + workspace.dequant_bytes(big)
    assert workspace.in_layer_backward_bytes(big, tmp) == expected > tmp
    lora = big.with_(method="lora")
    assert workspace.dequant_bytes(lora) == 0 and workspace.in_layer_backward_bytes(lora, tmp) == tmp
    tiny = tiny_setup(method="qlora", precision="bf16-mixed", batch=4, seq=256, checkpointing=True)
    assert workspace.in_layer_backward_bytes(tiny, workspace.recompute_gradient_bytes(tiny)) == \
        workspace.recompute_gradient_bytes(tiny)
    # and the budget's backward carries it where the recomputed layer is the backward's peak (512 tokens; at 2,048
    # the loss's gradients outweigh it)
    short = big.with_(seq=512)
    backward = estimate_setup(short).phases[Phase.BACKWARD]
    tmp = workspace.recompute_gradient_bytes(short)
    assert backward[MemCategory.WORKSPACE] == act.layer_fixed_bytes(short) + workspace.in_layer_backward_bytes(
        short, tmp) > act.layer_fixed_bytes(short) + tmp


def test_fsdp_loads_the_weights_once_per_node() -> None:
    """FSDP with fsdp_cpu_ram_efficient_loading (oomlab's launch files set it): rank 0 loads, the others build on
    meta -- one copy of the weights in host RAM, not one per process; DDP and QLoRA (quantized: every rank) load
    per process."""
    kw = {"model": "llama-2-70b", "gpu": "a100-80gb", "gpus": 8, "precision": "bf16-mixed"}
    fsdp = make_setup(strategy="fsdp2", method="lora", **kw)
    ddp = make_setup(strategy="ddp", method="lora", **kw)
    qlora = make_setup(strategy="fsdp2", method="qlora", **kw)
    assert estimate_setup(fsdp, 0).host_ram_bytes == weight_bytes_total(fsdp)
    assert estimate_setup(ddp, 0).host_ram_bytes == 8 * weight_bytes_total(ddp)
    assert estimate_setup(qlora, 0).host_ram_bytes == 8 * weight_bytes_total(qlora)


@pytest.mark.parametrize(("strategy", "nodes"), [("fsdp-offload", 1), ("fsdp-offload", 2), ("fsdp2-offload", 2)])
def test_fsdp_offload_host_ram_is_the_host_share_per_node(strategy: str, nodes: int) -> None:
    """FSDP offload keeps every model state on the host (sharding.SHARES: HOST): one node holds 1 / nodes of the
    fp32 weights, gradients and Adam state (4 + 4 + 8 bytes per parameter), beside rank 0's loaded replica."""
    s = make_setup(model="llama-13b", gpu="a100-80gb", gpus=4, nodes=nodes, strategy=strategy, precision="bf16-mixed")
    assert estimate_setup(s, 0).host_ram_bytes == 4 * N13 + 16 * N13 // nodes


_MODELS = ("llama-2-7b", "llama-3.1-8b", "llama-13b", "mistral-7b")
_STRATEGIES = ("single", "ddp", "fsdp", "fsdp2", "fsdp-offload", "fsdp2-offload", "zero1", "zero2", "zero3",
               "zero2-offload", "zero3-offload")


def _random_setup(data):
    """A random valid setup (invalid combinations are skipped by the caller)."""
    from hypothesis import strategies as st

    gpus = data.draw(st.sampled_from((1, 2, 4, 8)))
    return make_setup(
        model=data.draw(st.sampled_from(_MODELS)), gpu=data.draw(st.sampled_from(("a100-80gb", "t4", "l4"))),
        gpus=gpus, strategy=data.draw(st.sampled_from(_STRATEGIES if gpus > 1 else ("single",))),
        method=data.draw(st.sampled_from(("full", "lora", "qlora"))),
        precision=data.draw(st.sampled_from(("fp16-mixed", "bf16-mixed", "fp32", "fp16"))),
        optimizer=data.draw(st.sampled_from(("adamw", "adamw-fused", "adamw-8bit", "sgd"))),
        batch=data.draw(st.integers(1, 64)), seq=data.draw(st.sampled_from((128, 512, 2048))),
        checkpointing=data.draw(st.booleans()))


def test_no_phase_omits_a_live_component() -> None:
    """Over random setups: each phase holds every component the inventory says is live in it, backward holds
    activations or gradients, the forward is no smaller than its end (the logits with every saved activation), and
    the peak is no smaller than any phase."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from oomlab.budget.inventory import forward_end_bytes, live_components, take_inventory

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def check(data) -> None:
        try:
            setup = _random_setup(data)
        except InvalidValueError:
            return
        result = estimate_setup(setup)
        inventory = take_inventory(setup)
        live = live_components(setup, inventory)
        for phase, categories in live.items():
            held = {k for k, v in result.phases[phase].items() if v}
            assert categories <= held, (setup, phase, categories - held)
        # backward's peak holds activations or gradients, or is larger than the moment that held them: under ZeRO-3
        # with offload (gradients on the host) it can be the end of backward, the embedding gathered and its
        # gradient in flight, every activation freed
        backward = result.phases[Phase.BACKWARD]
        assert backward.get(MemCategory.ACTIVATIONS) or backward.get(MemCategory.GRADIENTS) or (
            setup.strategy.zero_stage == 3
            and sum(backward.values()) >= inventory.tensors.layer_activations + inventory.tensors.loss_backward), setup
        assert sum(result.phases[Phase.FORWARD].values()) >= forward_end_bytes(inventory), setup
        assert all(result.per_gpu_peak_bytes >= sum(c.values()) for c in result.phases.values())

    check()


def test_device_map_gpus_hold_every_phase_share() -> None:
    """Over random setups on the device_map route: each GPU's peak is at least its share of every phase (the LM
    head's GPU holds the forward's logits, checkpointed or not), and one GPU ({"": 0}) is the one-GPU budget."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from oomlab.remedies.placement import phase_components, place_device_map, share_out

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def check(data) -> None:
        try:
            setup = make_setup(model=data.draw(st.sampled_from(("llama-2-7b", "llama-2-70b"))), gpu="a100-80gb",
                               gpus=data.draw(st.sampled_from((1, 2, 8))),
                               method=data.draw(st.sampled_from(("lora", "qlora", "full"))),
                               batch=data.draw(st.integers(1, 160)), checkpointing=data.draw(st.booleans()))
        except InvalidValueError:
            return
        single = estimate_setup(setup.with_(gpus=1))
        placement = place_device_map(setup, single)
        if placement.spilled:
            return
        total = sum(g.weight_bytes for g in placement.gpus)
        for g in placement.gpus:
            if not g.modules:
                continue
            for comps in phase_components(single).values():
                assert g.peak_bytes >= share_out(comps, g.weight_bytes, len(g.layers), g.holds_lm_head, setup,
                                                 total)
        assert sum(g.holds_lm_head for g in placement.gpus) == 1
        if setup.gpus == 1:
            assert placement.per_gpu_peak_bytes == single.per_gpu_peak_bytes

    check()


def test_device_map_on_one_gpu_counts_activations() -> None:
    """accelerate returns {"": 0} when the model fits one GPU: its peak is the one-GPU budget's, activations in."""
    from oomlab.remedies.placement import place_device_map

    setup = make_setup(model="llama-2-7b", gpu="a100-80gb", gpus=1, method="lora")
    single = estimate_setup(setup)
    placement = place_device_map(setup, single)
    assert placement.gpus[0].modules == ("",)
    assert placement.gpus[0].layers == tuple(range(32))
    assert placement.per_gpu_peak_bytes == single.per_gpu_peak_bytes


def test_zero3_offload_backward_peak_can_be_its_end() -> None:
    """ZeRO-3 with offload at a short sequence (llama-3.1-8b, 2 GPUs, batch 1 × 128): gradients live on the host,
    and backward's peak is its end -- the 525M-parameter embedding gathered for its backward and its gradient in
    flight -- above the moment that held every activation."""
    setup = make_setup(model="llama-3.1-8b", gpu="a100-80gb", gpus=2, strategy="zero3-offload", method="full",
                       precision="fp16-mixed", optimizer="adamw", batch=1, seq=128, checkpointing=False)
    from oomlab.budget.inventory import take_inventory

    tensors = take_inventory(setup).tensors
    backward = estimate_setup(setup).phases[Phase.BACKWARD]
    assert not backward.get(MemCategory.ACTIVATIONS) and not backward.get(MemCategory.GRADIENTS)
    assert sum(backward.values()) > tensors.layer_activations + tensors.loss_backward
