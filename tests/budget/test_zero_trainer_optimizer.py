"""The optimizer DeepSpeed ZeRO wraps, by what the JSON and the HF Trainer build: the JSON's optimizer block is
DeepSpeed's FusedAdam (no temporary); without one the Trainer's own optimizer steps the fp32 partition, and
``adamw_torch`` (foreach on CUDA) allocates ``exp_avg_sq_sqrt``, one fp32 partition, in the step."""

import pytest

from oomlab.budget.deepspeed import (
    adam_temp_bytes,
    foreach_adamw,
    optimizer_note,
    optimizer_source,
    partition_12,
    zero_states,
)
from oomlab.budget.deepspeed_config import OptimizerSource, read_deepspeed_config, settings_for
from oomlab.budget.deepspeed_layout import stage3_partition
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory, Phase
from oomlab.core.units import format_size

P7 = 6_738_415_616  # llama-2-7b's parameters
WORLD = 8
PS = P7 // WORLD  # a multiple of 2N: no padding (stage_1_and_2.py:441-447)
NORMS = 65 * 4096  # two RMSNorms per layer and the final one: the Trainer's no-decay group
DECAY_PS = (P7 - NORMS) // WORLD  # the decay group's partition
NO_BLOCK = {"fp16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto",
            "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                                  "reduce_bucket_size": "auto"}}
BLOCK = {**NO_BLOCK, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}


def _launch(config, optimizer="adamw", stage=2, gpus=WORLD, offload=False):
    """llama-2-7b on 8 × V100-32GB, fp16, 1 × 2048, checkpointing; ``optimizer`` is the Trainer's --optim."""
    zero = {**config["zero_optimization"], "stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return read_deepspeed_config({**config, "zero_optimization": zero}, model="llama-2-7b", gpu="v100-32gb", gpus=gpus,
                                 precision="fp16-mixed", optimizer=optimizer, batch=1, seq=2048, checkpointing=True)


def _workspace(launch, phase=Phase.OPTIMIZER):
    return estimate_setup(launch.setup, 0, launch.settings).phases[phase][MemCategory.WORKSPACE]


@pytest.mark.parametrize(("config", "expected"), [
    (NO_BLOCK, OptimizerSource.TRAINER),  # the Trainer's create_optimizer (integrations/deepspeed.py:586-589)
    (BLOCK, OptimizerSource.DEEPSPEED),  # FusedAdam (engine.py:2402-2408)
    ({**NO_BLOCK, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, OptimizerSource.TORCH_ADAM),
])
def test_who_builds_the_optimizer_is_read_off_the_json(config, expected) -> None:
    """The optimizer block (or its absence, or torch_adam) decides who builds the optimizer."""
    assert _launch(config).settings.optimizer_source is expected


def test_7b_zero2_x8_trainer_adamw_torch_temporary_in_the_adamw_step() -> None:
    """The issue's run: 7B, ZeRO-2 over 8 GPUs, a JSON without an optimizer block, the Trainer's adamw_torch: the
    optimizer phase holds the fp32 gradient and exp_avg_sq_sqrt, each one fp32 partition -- 3.14 GiB, the request
    that killed the run on 32 GB GPUs -- and it is the step's peak."""
    launch = _launch(NO_BLOCK, "adamw")
    ds = settings_for(launch.setup, launch.settings)
    part = partition_12(launch.setup, ds)
    assert part.partition == PS  # the two groups' partitions: 266,240 norms / 8 ranks pad nothing
    assert part.group_partition == DECAY_PS  # the decay group: all but the 65 norms
    temp = adam_temp_bytes(launch.setup, ds, part.group_partition)
    assert temp == 4 * DECAY_PS == 3_369_074_688 and format_size(temp) == "3.14 GiB"
    z = zero_states(launch.setup, launch.settings)
    assert z.step_temps == 4 * DECAY_PS + temp  # the fp32 gradient beside the sqrt (the half flat copy freed: :3119)
    budget = estimate_setup(launch.setup, 0, launch.settings)
    assert budget.peak_phase is Phase.OPTIMIZER
    assert budget.phases[Phase.OPTIMIZER][MemCategory.WORKSPACE] == z.step_temps  # no permanent buffer in ZeRO-2
    assert "3.14 GiB; torch/optim/adam.py:762" in optimizer_note(launch.setup, launch.settings)


@pytest.mark.parametrize(("config", "optimizer"), [
    (NO_BLOCK, "adamw-fused"),  # the Trainer's default on torch >= 2.8 (training_args.py:806-811)
    (BLOCK, "adamw-fused"),  # the block wins: DeepSpeed's FusedAdam whatever --optim says
    (NO_BLOCK, "sgd"),
    (NO_BLOCK, "adamw-8bit"),
])
def test_in_place_optimizers_add_no_temporary(config, optimizer) -> None:
    """FusedAdam, AdamW(fused=True), SGD and 8-bit AdamW update in place: the step's workspace is the gradient
    conversion only (half flat copy + fp32 copy), 2 GiB less than adamw_torch's on the 7B × 8."""
    launch = _launch(config, optimizer)
    assert not foreach_adamw(launch.setup, settings_for(launch.setup, launch.settings))
    ds = settings_for(launch.setup, launch.settings)
    group = partition_12(launch.setup, ds).group_partition
    assert group == (DECAY_PS if config is NO_BLOCK else PS)
    assert _workspace(launch) == (2 + 4) * group
    if config is NO_BLOCK:
        assert _workspace(_launch(NO_BLOCK, "adamw")) - _workspace(launch) == 2 * DECAY_PS


def test_offloaded_step_has_no_gpu_temporary() -> None:
    """zero2-offload: the optimizer steps on the host (DeepSpeedCPUAdam), nothing in the GPU's optimizer phase."""
    launch = _launch(NO_BLOCK, "adamw", offload=True)
    assert not foreach_adamw(launch.setup, settings_for(launch.setup, launch.settings))
    assert zero_states(launch.setup, launch.settings).step_temps == 0
    assert "steps on the host" in optimizer_note(launch.setup, launch.settings)


def test_zero3_temporary_is_one_sub_group() -> None:
    """ZeRO-3 steps sub-group by sub-group (stage3.py:2921): the temporary is the largest sub-group's fp32 copy."""
    launch = _launch(NO_BLOCK, "adamw", stage=3)
    ds = settings_for(launch.setup, launch.settings)
    part = stage3_partition(launch.setup, ds.sub_group_size, ds.stage3_param_persistence_threshold)
    sub = part.sub_group
    assert sub == part.trained and PS <= sub < PS + 300  # 842M elements < sub_group_size 1e9: one sub-group
    assert zero_states(launch.setup, launch.settings).step_temps == 8 * sub
    fused = _launch(NO_BLOCK, "adamw-fused", stage=3)
    assert zero_states(fused.setup, fused.settings).step_temps == 6 * sub


def test_without_a_json_adamw_is_oomlabs_launch_json_block() -> None:
    """A setup with no JSON (plan, the explorer) runs oomlab's launch JSON: adamw as the AdamW block (FusedAdam)."""
    launch = _launch(NO_BLOCK, "adamw")
    ds = settings_for(launch.setup, None)
    assert optimizer_source(launch.setup, ds) is OptimizerSource.DEEPSPEED
    assert zero_states(launch.setup).step_temps == 6 * PS
    assert "FusedAdam" in optimizer_note(launch.setup)


def test_measured_trainer_adamw_torch_step_holds_one_more_fp32_partition() -> None:
    """Measured on gloo CPU ranks (docs/deepspeed-small-scale.md): ZeRO-2 with the optimizer the HF Trainer builds,
    optim adamw_torch (foreach) against adamw_torch_fused: the foreach step holds the fp32 gradient and exp_avg_sq_sqrt
    (4 + 4 bytes per element of the decay group's partition), the fused one peaks converting the gradient (2 + 4):
    the optimizer phases differ by 2 bytes per element, within 2 %; each agrees with the analytic phase."""
    from oomlab.evidence import deepspeed_measured as dm

    data = dm.load_committed()
    by_label = {c["label"]: (c, m) for c, m in zip(data["cases"], data["measured"], strict=True)}
    foreach, fused = by_label["ZeRO-2, the Trainer's adamw_torch"], by_label["ZeRO-2, the Trainer's adamw_torch_fused"]
    peak = lambda ranks: max(dm.measured_peaks(r)[Phase.OPTIMIZER] for r in ranks)  # noqa: E731
    setup, settings = dm.case_setup(foreach[0]), dm.case_settings(foreach[0])
    group = partition_12(setup, settings_for(setup, settings)).group_partition
    assert foreach[0]["trainer_optim"] == "adamw_torch" and settings.optimizer_source is OptimizerSource.TRAINER
    assert peak(foreach[1]) - peak(fused[1]) == pytest.approx((8 - 6) * group, rel=0.02)
    for case, ranks in (foreach, fused):
        assert peak(ranks) == pytest.approx(dm.analytic_step(case).phases[Phase.OPTIMIZER], rel=0.02)


@pytest.mark.heavy
def test_check_reads_the_trainers_optim_under_a_json_without_optimizer(tmp_path) -> None:
    """`oomlab check` of the issue's launch (deepspeed, a ZeRO-2 JSON without an optimizer block, 8 x V100-32GB,
    llama-2-7b fp16): with --optim adamw_torch the step needs the extra fp32 partition and the run is not called a
    fit; with --optim adamw_torch_fused it needs 2 bytes per element of the partition less, and the note says so."""
    import json

    import oomlab

    (tmp_path / "ds.json").write_text(json.dumps(NO_BLOCK))
    peaks, verdicts = {}, {}
    for optim in ("adamw_torch", "adamw_torch_fused"):
        result = oomlab.check(gpu="v100-32gb", gpus=WORLD, model="llama-2-7b", deepspeed=str(tmp_path / "ds.json"),
                              launch=f"deepspeed train.py --deepspeed ds.json --fp16 --per_device_train_batch_size 1 "
                                     f"--gradient_checkpointing --optim {optim} --model_max_length 2048")
        assert result.launch.deepspeed.optimizer_source is OptimizerSource.TRAINER
        peaks[optim], verdicts[optim] = result.to_dict()["per_gpu_peak_bytes"], result.to_dict()["verdict"]
        note = next(n for n in result.budget.notes if n.startswith("optimizer:"))
        assert ("exp_avg_sq_sqrt" in note) == (optim == "adamw_torch")
    assert verdicts["adamw_torch"] != "fits"
    assert peaks["adamw_torch"] - peaks["adamw_torch_fused"] >= 2 * DECAY_PS
