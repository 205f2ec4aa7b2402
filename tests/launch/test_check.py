"""oomlab check: load before step, the load path's figure, and the fix only when something fails."""

from pathlib import Path

from oomlab.core.choices import Strategy
from oomlab.launch.check import FailsAt, check_launch
from oomlab.launch.paths import LoadPath
from oomlab.launch.read import LaunchInputs


def test_zero3_without_zero_init_fails_at_load(tmp_path: Path) -> None:
    """accelerate's inline DeepSpeed ZeRO-3 with zero3_init_flag false: the engine moves the half replica with
    .to() -- a load failure on a T4 -- while the same launch under zero.Init loads."""
    acc = tmp_path / "accelerate_ds.yaml"
    acc.write_text("distributed_type: DEEPSPEED\nnum_processes: 4\nmixed_precision: fp16\ndeepspeed_config:\n"
                   "  zero_stage: 3\n  zero3_init_flag: false\n")
    r = check_launch(LaunchInputs(accelerate_config=str(acc), model="llama-13b", gpu="t4"))
    assert r.launch.setup.strategy is Strategy.ZERO3 and not r.launch.zero3_init
    assert str(r.launch.fields["zero3_init"].origin).endswith("accelerate_ds.yaml:6 deepspeed_config.zero3_init_flag")
    assert r.load.path is LoadPath.DEEPSPEED_TO and r.fails_at is FailsAt.LOAD
    acc.write_text("distributed_type: DEEPSPEED\nnum_processes: 4\nmixed_precision: fp16\ndeepspeed_config:\n"
                   "  zero_stage: 3\n  zero3_init_flag: true\n")
    r = check_launch(LaunchInputs(accelerate_config=str(acc), model="llama-13b", gpu="t4"))
    assert r.load.path is LoadPath.ZERO_INIT and r.load.fits


def test_a_fitting_launch_has_no_fix() -> None:
    """LoRA on a 7B that loads and fits: fails_at None, no fix, the step's peak under capacity."""
    r = check_launch(LaunchInputs(command="torchrun --nproc_per_node 2 train.py --per_device_train_batch_size 1 "
                                  "--bf16 --gradient_checkpointing --max_seq_length 512 --use_peft --lora_r 16",
                                  model="llama-2-7b",
                                  gpu="a100-80gb"))
    assert r.fails_at is None and r.smallest_fix is None and r.phase is None
    assert r.per_gpu_peak_bytes == r.budget.per_gpu_peak_bytes <= r.budget.capacity_bytes
    data = r.to_dict()
    assert {"fails_at", "phase", "per_gpu_peak_bytes", "setup", "smallest_fix"} <= set(data)


def test_step_failure_names_the_phase(tmp_path: Path) -> None:
    """A launch that loads (ZeRO-3 under zero.Init) but not steps: fails_at step, in one of the step's phases, and
    the fix it proposes loads and fits."""
    r = check_launch(LaunchInputs(command="torchrun --nproc_per_node 4 train.py --fsdp 'full_shard auto_wrap' --fp16 "
                                  "--per_device_train_batch_size 1", model="llama-13b", gpu="t4"))
    assert r.load.fits and r.fails_at is FailsAt.STEP and r.phase in ("forward", "backward", "optimizer")
    fix = r.smallest_fix
    assert fix is not None and fix.load.fits and fix.per_gpu_peak_bytes <= r.budget.capacity_bytes
