"""Traced memory (oomlab.budget.traced) against real tensors measured by the CPU allocator
(oomlab.instruments.measured)."""

from __future__ import annotations

import json
import os
import time

import pytest

from oomlab.budget import step, traced
from oomlab.budget.result import Phase
from oomlab.budget.step import tiny_setup
from oomlab.budget.traced import trace_step
from oomlab.budget.tracker import TraceResult
from oomlab.core.errors import InvalidValueError
from oomlab.core.setup import make_setup
from oomlab.instruments.measured import measure_real

# bitsandbytes logs at import, transformers deprecates its own alias internally (peft calls it)
pytestmark = [
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    """Traces write their cache under the test's tmp folder, never outputs/."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path / "cache"))


RNG_STATE_BYTES = 5056  # torch.get_rng_state() on CPU: saved by torch.utils.checkpoint per checkpointed layer


@pytest.mark.heavy
@pytest.mark.parametrize(
    "knobs",
    [
        {},  # fp16-mixed full AdamW, sdpa: peaks in the optimizer step
        {"precision": "fp16"},  # pure half: peaks in backward at this size
        {"precision": "fp32", "optimizer": "sgd"},
        {"attention": "eager", "batch": 4, "seq": 256},  # eager saves the a x s x s probabilities
        {"batch": 4, "seq": 512},  # activation-heavy: peaks at the start of backward
        {"method": "lora"},
        {"method": "lora", "precision": "bf16-mixed", "batch": 4, "seq": 256},
    ],
)
def test_fake_trace_equals_real_allocator(knobs):
    """The fake-tensor trace peak equals the CPU allocator's peak on real tensors (no checkpointing)."""
    setup = tiny_setup(**knobs)
    traced = trace_step(setup, use_cache=False)
    measured = measure_real(setup, steps=1)
    # NB: up to 64 bytes of tiny tensors the allocator rounds (scalar loss, step counters)
    assert abs(traced.peak_bytes - measured.peak_bytes) <= 64
    assert traced.peak_phase is measured.peak_phase


@pytest.mark.heavy
@pytest.mark.parametrize("knobs", [{"batch": 4, "seq": 512}, {"method": "lora", "batch": 4, "seq": 256}])
def test_checkpointed_trace_misses_only_the_rng_state(knobs):
    """With checkpointing the allocator holds exactly one CPU RNG state per layer more than the trace sees."""
    setup = tiny_setup(checkpointing=True, **knobs)
    traced = trace_step(setup, use_cache=False)
    measured = measure_real(setup, steps=1)
    layers = setup.model.num_hidden_layers
    assert abs(measured.peak_bytes - traced.peak_bytes - layers * RNG_STATE_BYTES) <= 64


def test_lora_tracks_only_trainable_parameters():
    """LoRA traces (MemTracker alone refuses frozen parameters); gradients and state cover only the adapters."""
    setup = tiny_setup(method="lora", optimizer="adamw")
    result = trace_step(setup, use_cache=False)
    model = step.build_model(setup, "meta")
    adapter_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    after_step = dict(next(snap for label, _, snap in result.timeline if label == "optimizer.step end"))
    assert after_step["optstate"] == 2 * adapter_bytes + 4 * sum(1 for p in model.parameters() if p.requires_grad)
    assert after_step["gradient"] == adapter_bytes


def test_full_finetune_peaks_in_optimizer_and_lora_in_backward():
    """Full fine-tuning peaks in optimizer.step (params + grads + 2 moments + sqrt(v)); LoRA at backward start."""
    full = trace_step(tiny_setup(), use_cache=False)
    lora = trace_step(tiny_setup(method="lora", batch=4, seq=256), use_cache=False)
    assert full.peak_phase is Phase.OPTIMIZER
    assert lora.peak_phase is Phase.BACKWARD
    labels = [label for label, _, _ in lora.timeline]
    first_layer_backward = next(i for i, label in enumerate(labels) if ".layers." in label and "pre-bw" in label)
    highest = max(range(len(labels)), key=lambda i: sum(lora.timeline[i][2].values()))
    # the gradient of the logits (loss -> lm_head), before any decoder layer's backward
    assert labels[highest].startswith("peak before") and "lm_head pre-bw" in labels[highest]
    assert highest < first_layer_backward


def test_peak_by_category_sums_to_peak():
    """The categories at the peak add up to the peak; the phase peaks' maximum is the peak."""
    result = trace_step(tiny_setup(method="lora"), use_cache=False)
    assert sum(result.peak_by_category.values()) == result.peak_bytes
    assert max(result.phase_peaks.values()) == result.peak_bytes
    assert result.phase_peaks[result.peak_phase] == result.peak_bytes


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_shards_optimizer_state(world):
    """FSDP over a fake process group: each rank's optimizer state is 1/world of the single-GPU state."""
    single = trace_step(tiny_setup(), use_cache=False)
    sharded = trace_step(tiny_setup(strategy="fsdp", gpus=world), use_cache=False)

    def optstate(result: TraceResult) -> int:
        return dict(next(snap for label, _, snap in result.timeline if label == "optimizer.step end"))["optstate"]

    # NB: the step counters (4 bytes per parameter tensor) are not sharded
    assert optstate(sharded) == pytest.approx(optstate(single) / world, rel=0.01)
    assert sharded.method == "fsdp1-memtracker-fake"


def test_fsdp_offload_keeps_states_off_the_gpu_total():
    """fsdp-offload: sharded parameters, gradients and optimizer state are reported as host_* and not in the peak."""
    result = trace_step(tiny_setup(strategy="fsdp-offload", gpus=2), use_cache=False)
    assert result.peak_by_category.get("host_parameter", 0) > 0
    assert result.peak_bytes == sum(v for k, v in result.peak_by_category.items() if not k.startswith("host_"))


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"strategy": "zero2", "gpus": 2}, "strategy 'zero2' is analytic only"),
        ({"method": "qlora"}, "method 'qlora' cannot be traced"),
        ({"optimizer": "adamw-8bit"}, "optimizer 'adamw-8bit' cannot be traced"),
    ],
)
def test_untraceable_setups_say_why(knobs, message):
    """ZeRO-1/2, QLoRA and 8-bit AdamW are refused with the reason and the alternative."""
    with pytest.raises(InvalidValueError, match=message):
        trace_step(tiny_setup(**knobs), use_cache=False)


def test_cache_round_trip(tmp_path, monkeypatch):
    """A cached trace reads back equal; use_cache=False traces again; the key changes with the setup."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path))
    setup = tiny_setup()
    first = trace_step(setup)
    files = list(tmp_path.glob("trace-*.json"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    assert trace_step(setup) == first
    assert TraceResult.from_json(json.loads(files[0].read_text())) == first
    os.utime(files[0], (0, 0))
    assert trace_step(setup, use_cache=False).peak_bytes == first.peak_bytes
    assert traced.cache_key(setup) != traced.cache_key(setup.with_(seq=64))
    assert traced.cache_key(setup) == traced.cache_key(setup.with_(gpu=make_setup(gpus=1, gpu="h100-80gb").gpu))


@pytest.mark.heavy
def test_full_size_smoke():
    """llama-7b, full fp16-mixed AdamW, seq 512, batch 1 traces in well under a minute, peaking in the optimizer."""
    setup = make_setup(gpus=1, model="llama-7b", gpu="a100-80gb", seq=512, batch=1)
    start = time.perf_counter()
    result = trace_step(setup, use_cache=False)
    assert time.perf_counter() - start < 60
    params = setup.model.num_parameters
    assert result.peak_phase is Phase.OPTIMIZER
    # fp32 params + grads + 2 moments + AdamW's foreach sqrt(v): 20 bytes per parameter at the optimizer peak
    assert result.peak_bytes == pytest.approx(20 * params, rel=0.01)


def test_ddp_default_buckets_add_one_gradient_copy():
    """DDP(gradient_as_bucket_view=False) holds one more copy of the gradients than a single-GPU step (gloo, 1 rank)."""
    from oomlab.instruments.measured import measure_ddp_buckets

    buckets = measure_ddp_buckets(tiny_setup())
    assert buckets.bucket_bytes == buckets.gradient_bytes
