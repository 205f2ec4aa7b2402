"""DeepSpeed ZeRO-1/2/3 as oomlab budgets them: the per-stage terms (full size, by hand), offload host RAM, loading
under zero.Init, the bf16 BF16_Optimizer path, "auto" as the HF integration resolves it, and a user's DeepSpeed JSON
read into the same setup as the flags (bad values named)."""

import json

import pytest

import oomlab
from oomlab.budget import deepspeed_layout as layout
from oomlab.budget.deepspeed import host_offload_bytes, load_peak_bytes, zero_states
from oomlab.budget.deepspeed_config import (
    DeepSpeedSettings,
    read_deepspeed_config,
    resolve,
    settings_for,
    zero_optimization_block,
)
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.step import tiny_setup
from oomlab.core.choices import Strategy
from oomlab.core.errors import InvalidValueError
from oomlab.core.models import load_model
from oomlab.core.setup import make_setup

P = 13_015_864_320  # llama-13b's parameters
N = 4
PS = P // N  # ZeRO-1/2's flat partition: P is a multiple of 2N, no padding (stage_1_and_2.py:441-447)
H = 5120  # llama-13b's hidden size
LARGEST = 32_000 * H  # the embedding (and the LM head): the largest parameter / module
GIB = 2**30


def _seed(strategy: str, **kw):
    """llama-13b on 4 × T4, full fine-tuning, fp16-mixed, DeepSpeed's AdamW, 1 × 2048 (the issue's case)."""
    kw = {"model": "llama-13b", "gpu": "t4", "gpus": N, "method": "full", "precision": "fp16-mixed",
          "optimizer": "adamw", "batch": 1, "seq": 2048, **kw}
    return make_setup(strategy=strategy, **kw)


def test_full_size_facts() -> None:
    """llama-13b's parameter count and its flat ZeRO partition on 4 ranks."""
    setup = _seed("zero2")
    assert setup.model.num_parameters == P
    part = layout.flat_partition(setup)
    assert (part.aligned, part.partition, part.largest) == (P, PS, LARGEST)
    assert part.in_partition > PS  # the whole parameters straddling a partition's edges (get_partition_info)
    assert layout.largest_module(setup) == LARGEST


@pytest.mark.parametrize(("strategy", "weights", "master", "optimizer", "full_gradients"), [
    # ZeRO-1/2: the half flat replica (+ 512 B of fp32 rotary buffers), fp32 master and Adam moments of the partition
    ("zero1", 2 * P + 512, 4 * PS, 8 * PS, 2 * P),  # ZeRO-1 reduces only in the epilogue: every half gradient first
    ("zero2", 2 * P + 512, 4 * PS, 8 * PS, 0),
    # offload: master and moments on the host; the replica stays
    ("zero2-offload", 2 * P + 512, 0, 0, 0),
])
def test_zero12_terms(strategy, weights, master, optimizer, full_gradients) -> None:
    """ZeRO-1/2 per GPU: replica, master, optimizer state, and which gradients are alive when."""
    z = zero_states(_seed(strategy))
    assert (z.weights, z.master, z.optimizer, z.full_gradients) == (weights, master, optimizer, full_gradients)
    part = layout.flat_partition(_seed(strategy))
    assert z.gradients == (0 if strategy == "zero2-offload" else 2 * part.in_partition)
    assert z.bucket == 2 * H * H  # reduce_bucket_size "auto" = h*h half elements, overlap_comm off below stage 3
    assert z.step_temps == (0 if strategy == "zero2-offload" else (2 + 4) * PS)  # flatten, then .to(fp32)


def test_zero3_terms() -> None:
    """ZeRO-3 per GPU: half partitions of every parameter (ceil(n/N) each), the permanent half gradient partition,
    fp32 master and moments of the partition, persistent small parameters (norms) kept gathered."""
    setup = _seed("zero3")
    z, ds = zero_states(setup), settings_for(setup)
    assert ds.stage3_param_persistence_threshold == 10 * H
    part = layout.stage3_partition(setup, ds.sub_group_size, ds.stage3_param_persistence_threshold)
    assert part.trained == PS  # every llama-13b parameter divides by 4
    persistent = (2 * 40 + 1) * H  # two norms per layer and the final norm, each <= 10 h elements
    assert part.persistent == persistent
    assert z.weights == 2 * PS + 2 * persistent + 512
    assert (z.master, z.optimizer, z.gradients, z.held_gradients) == (4 * PS, 8 * PS, 2 * PS, 2 * PS)
    assert z.bucket == 2 * H * H and z.bucket_permanent


def test_stages_order_the_model_states() -> None:
    """Each stage partitions one more thing: ZeRO-1 ≥ ZeRO-2 ≥ ZeRO-3 ≥ offloaded, per GPU at the peak."""
    peaks = [estimate_setup(_seed(s), 0).allocated_peak_bytes for s in ("zero1", "zero2", "zero3", "zero3-offload")]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4


@pytest.mark.parametrize(("strategy", "host"), [
    # fp32 master + fp32 gradient partition + half staging copy + Adam moments, and the largest parameter in half
    ("zero2-offload", (4 + 4 + 2 + 8) * PS + 2 * LARGEST),
    # half gradients, fp32 partitions, fp32 sub-group gradients, moments -- and the half parameter partitions
    ("zero3-offload", (2 + 4 + 4 + 8 + 2) * PS),
    ("zero2", 0), ("zero3", 0),
])
def test_offload_host_bytes(strategy, host) -> None:
    """Host bytes of one rank's offloaded states, and the host RAM per node the budget reports (ZeRO-1/2 load a half
    replica per process first; ZeRO-3 under zero.Init none)."""
    setup = _seed(strategy)
    assert host_offload_bytes(setup) == host
    load = 0 if setup.strategy.zero_stage == 3 else 2 * P  # from_pretrained's half weights
    assert estimate_setup(setup, 0).host_ram_bytes == N * (load + host)


def test_zero3_offload_without_offload_param() -> None:
    """offload_param=False under zero3-offload keeps the half partitions on the GPU, off the host."""
    setup = _seed("zero3-offload")
    kept = DeepSpeedSettings(offload_param=False)
    assert host_offload_bytes(setup) - host_offload_bytes(setup, kept) == 2 * PS
    assert zero_states(setup, kept).weights - zero_states(setup).weights == 2 * PS


def test_zero3_loads_without_a_replica() -> None:
    """Under zero.Init no full replica is moved to a GPU: the load-time peak is the partitions and the largest module
    gathered, far below a T4, where ZeRO-1/2 move the whole half replica (the seed's load-time OOM)."""
    capacity = _seed("zero3").gpu.total_memory_bytes
    zero3 = load_peak_bytes(_seed("zero3"), zero_states(_seed("zero3")))
    assert zero3 == 2 * PS + 512 + 2 * LARGEST
    assert zero3 < capacity / 2
    assert load_peak_bytes(_seed("zero2"), zero_states(_seed("zero2"))) == 2 * P + 512 > capacity
    assert any("no full replica moved to a GPU" in n for n in estimate_setup(_seed("zero3"), 0).notes)


def test_bf16_optimizer_path() -> None:
    """ZeRO-1 + bf16 + fp32 gradient accumulation is BF16_Optimizer: an fp32 buffer of the whole model held, the bf16
    gradients beside it until step(); no IPG bucket."""
    setup = _seed("zero1", gpu="a100-80gb", precision="bf16-mixed")
    z = zero_states(setup, DeepSpeedSettings(grad_accum_fp32=True))
    assert z.held_gradients == 4 * P and z.gradients == 4 * P + 2 * P and z.bucket == 0
    with pytest.raises(InvalidValueError, match="grad_accum_dtype fp32 with ZeRO-1 is budgeted for bf16"):
        zero_states(_seed("zero1"), DeepSpeedSettings(grad_accum_fp32=True))


def test_auto_resolves_as_the_hf_integration() -> None:
    """"auto" (None) becomes h*h, int(0.9*h*h), 10*h (transformers' trainer_config_finalize); overlap_comm defaults
    to stage == 3 as DeepSpeed's own config; given values are kept."""
    spec = load_model("llama-13b")
    auto = resolve(None, spec, Strategy.ZERO3)
    assert (auto.reduce_bucket_size, auto.stage3_prefetch_bucket_size, auto.stage3_param_persistence_threshold) == (
        H * H, int(0.9 * H * H), 10 * H)
    assert auto.overlap_comm is True and resolve(None, spec, Strategy.ZERO2).overlap_comm is False
    given = resolve(DeepSpeedSettings(reduce_bucket_size=5, overlap_comm=True), spec, Strategy.ZERO2)
    assert (given.reduce_bucket_size, given.overlap_comm) == (5, True)
    assert resolve(None, spec, Strategy.ZERO3_OFFLOAD).offload_param is True


USER_JSON = {  # a typical HF Trainer ZeRO-3 JSON: "auto" everywhere the integration fills in
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu"}, "overlap_comm": True, "contiguous_gradients": True,
                          "sub_group_size": 1e9, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True},
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
}


def test_users_json_gives_the_flags_setup(tmp_path) -> None:
    """A user's DeepSpeed JSON (a file, "auto" values) reads into the same setup and the same budget as the flags."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(USER_JSON))
    launch = read_deepspeed_config(path, model="llama-13b", gpu="t4", gpus=N, precision="fp16-mixed", batch=1,
                                   checkpointing=True)
    flags = _seed("zero3-offload", checkpointing=True)
    assert launch.setup == flags
    assert launch.resolved == settings_for(flags)
    from_json = estimate_setup(launch.setup, 0, launch.settings)
    assert from_json.allocated_peak_bytes == estimate_setup(flags, 0).allocated_peak_bytes
    assert from_json.host_ram_bytes == estimate_setup(flags, 0).host_ram_bytes


def test_json_without_auto_keeps_deepspeeds_defaults() -> None:
    """A key the JSON leaves out keeps DeepSpeed's own default (a 5e8-element bucket: 1 GB in half), not HF's."""
    launch = read_deepspeed_config({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}, model="llama-13b",
                                   gpu="t4", gpus=N, optimizer="adamw")
    assert launch.setup == _seed("zero2")
    assert launch.resolved.reduce_bucket_size == 500_000_000
    assert zero_states(launch.setup, launch.settings).bucket == 1_000_000_000


def test_written_block_reads_back() -> None:
    """zero_optimization_block writes concrete numbers that read back to the same setup and DeepSpeed states (stage 3's
    knobs only where stage 3 reads them)."""
    for strategy in ("zero1", "zero2", "zero3", "zero2-offload", "zero3-offload"):
        setup = _seed(strategy)
        config = {"fp16": {"enabled": True}, "optimizer": {"type": "AdamW"},
                  "zero_optimization": zero_optimization_block(setup)}
        launch = read_deepspeed_config(config, model="llama-13b", gpu="t4", gpus=N)
        assert launch.setup == setup and zero_states(setup, launch.settings) == zero_states(setup)
        fields = ("reduce_bucket_size", "overlap_comm", "contiguous_gradients", "offload_param")
        fields += ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "sub_group_size") * (
            setup.strategy.zero_stage == 3)
        assert all(getattr(launch.resolved, f) == getattr(settings_for(setup), f) for f in fields)


@pytest.mark.parametrize(("config", "kw", "message"), [
    ({"zero_optimization": {"stage": 4}}, {},
     "invalid zero_optimization.stage 4; oomlab budgets ZeRO stages 1, 2 and 3"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}, {},
     "offload_optimizer.device 'nvme' is not budgeted by oomlab (ZeRO-Infinity swaps to NVMe); use 'cpu'"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}}, {},
     "unknown offload_param.device 'gpu'; known: cpu, none, nvme"),
    ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}, {},
     "offload_optimizer with ZeRO stage 1 is not budgeted"),
    ({"zero_optimization": {"stage": 3, "sub_group_size": "auto"}}, {},
     "zero_optimization.sub_group_size is 'auto', which only reduce_bucket_size, stage3_prefetch_bucket_size, "
     "stage3_param_persistence_threshold accept; give a number"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}}, {},
     "invalid zero_optimization.reduce_bucket_size 'big'; expected a number of elements"),
    ({"optimizer": {"type": "Lion"}, "zero_optimization": {"stage": 2}}, {},
     "optimizer type 'Lion' is not budgeted; known: Adam, AdamW"),
    ({"fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}, {"precision": None},
     "fp16/bf16 'enabled' is 'auto' (the Trainer's --fp16/--bf16 decide); pass precision='fp16-mixed'"),
])
def test_bad_json_values_are_named(config, kw, message) -> None:
    """Every bad DeepSpeed JSON value is refused naming it and what is accepted, before any budget."""
    with pytest.raises(InvalidValueError) as err:
        read_deepspeed_config(config, model="llama-13b", gpu="t4", gpus=N, **kw)
    assert message in str(err.value)


@pytest.mark.parametrize(("kw", "message"), [
    ({"strategy": "zero2", "precision": "fp16"}, "precision 'fp16' with strategy 'zero2': DeepSpeed's fp16/bf16 "
     "always keep an fp32 master partition (no pure half optimizer states); that is precision 'fp16-mixed'"),
    ({"strategy": "zero3", "method": "qlora"}, "method 'qlora' with strategy 'zero3' is not budgeted"),
    ({"strategy": "zero2-offload", "optimizer": "adamw-8bit"}, "optimizer 'adamw-8bit' with strategy "
     "'zero2-offload': an offloaded DeepSpeed step runs DeepSpeedCPUAdam with fp32 states"),
])
def test_setups_deepspeed_cannot_run_are_refused(kw, message) -> None:
    with pytest.raises(InvalidValueError) as err:
        _seed(**kw)
    assert message in str(err.value)


def test_top_level_estimate_runs_zero3() -> None:
    """oomlab.estimate(strategy="zero3", ...) budgets ZeRO-3; the traced source is refused with the reason."""
    result = oomlab.estimate(model="llama-13b", gpu="t4", gpus=N, strategy="zero3", method="full",
                             precision="fp16-mixed", optimizer="adamw", batch=1, seq=2048)
    assert result.allocated_peak_bytes == estimate_setup(_seed("zero3"), None).allocated_peak_bytes
    assert 40 * GIB < result.allocated_peak_bytes < 80 * GIB
    with pytest.raises(InvalidValueError, match="strategy 'zero3' is analytic only"):
        oomlab.estimate(model="llama-13b", gpu="t4", gpus=N, strategy="zero3", source="traced")


def test_one_rank_gathers_nothing() -> None:
    """ZeRO-3 on one rank: param.data views its own partition; no reuse window, prefetch or persistent copies."""
    z = zero_states(tiny_setup(None, strategy="zero3", gpus=1, precision="bf16-mixed"))
    assert (z.gathered_forward, z.gathered_layer, z.persistent_gathered) == (0, 0, 0)
