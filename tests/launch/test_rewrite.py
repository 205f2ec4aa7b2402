"""The fix in the user's own files (issue 22): the DeepSpeed JSON, the accelerate YAML and the TrainingArguments JSON
changed exactly where the fix says, each changed line marked, the rest (comments, layout) kept; the command keeps
naming those files instead of growing a second, conflicting spelling of the same change; and the files as changed
read back, through the same reader, to the fixed setup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlab.core.choices import Strategy
from oomlab.launch.check import check_launch
from oomlab.launch.display import render_check, render_markdown
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch
from oomlab.remedies.ladder import Rung

COMMAND_DS = ("deepspeed --num_gpus 4 train.py --deepspeed ds_zero2.json --per_device_train_batch_size 8 "
              "--gradient_accumulation_steps 2 --bf16 --max_seq_length 4096")


@pytest.fixture
def deepspeed_run(tmp_path: Path):
    ds = tmp_path / "ds_zero2.json"
    ds.write_text(json.dumps({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "overlap_comm": True},
                              "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
                              "gradient_clipping": 1.0}, indent=4))
    inputs = LaunchInputs(command=COMMAND_DS, model="llama-2-7b", gpu="a10g", command_dir=str(tmp_path))
    return inputs, check_launch(inputs), ds


def test_the_deepspeed_json_carries_the_fix(deepspeed_run) -> None:
    """Llama-2-7B full fine-tuning, ZeRO-2 over 4 x A10G at micro-batch 8 x 4096: the ladder's fix (checkpointing,
    micro-batch 1 with accumulation 16, optimizer offload) in the user's JSON, which states the batch numbers the HF
    integration checks against TrainingArguments."""
    inputs, r, ds = deepspeed_run
    assert [s.rung for s in r.decision.steps] == [Rung.CHECKPOINTING, Rung.MICRO_BATCH, Rung.OFFLOAD]
    [changed] = r.smallest_fix.files
    assert changed.path == str(ds) and changed.before == ds.read_text()
    after = json.loads(changed.after)
    assert after["zero_optimization"] == {"stage": 2, "overlap_comm": True,
                                          "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert (after["train_micro_batch_size_per_gpu"], after["gradient_accumulation_steps"]) == (1, 16)
    assert after["gradient_clipping"] == 1.0 and after["bf16"] == {"enabled": "auto"}  # the rest as it was
    plus = [line[2:].strip() for line in changed.marked if line.startswith("+ ")]
    minus = [line[2:].strip() for line in changed.marked if line.startswith("- ")]
    assert '"train_micro_batch_size_per_gpu": 1,' in plus and '"train_micro_batch_size_per_gpu": 8,' in minus
    assert '"gradient_clipping": 1.0' not in plus + minus
    # the command names the same JSON (no second --deepspeed file) and carries the flags' side of the change
    launch = r.smallest_fix.launch
    assert "--deepspeed ds_zero2.json" in launch and launch.count("--deepspeed") == 1
    assert "--per_device_train_batch_size 1" in launch and "--gradient_accumulation_steps 16" in launch
    assert "--gradient_checkpointing" in launch
    # where to make it says the same accumulation: the user's 2 times the ladder's 8, not the ladder's alone
    assert any("--gradient_accumulation_steps 16" in how for how in r.smallest_fix.how), r.smallest_fix.how
    # the JSON as changed, read back by the same reader: the fixed strategy and batch
    ds.write_text(changed.after)
    fixed = read_launch(LaunchInputs(command=launch, model="llama-2-7b", gpu="a10g", command_dir=str(ds.parent)))
    assert fixed.setup.strategy is Strategy.ZERO2_OFFLOAD and fixed.setup.batch == 1 and fixed.setup.checkpointing
    assert fixed.setup == r.smallest_fix.setup


def test_check_shows_the_marked_lines(deepspeed_run) -> None:
    _, r, ds = deepspeed_run
    text = render_check(r)
    assert f"{ds} (DeepSpeed JSON, 7 line(s) changed):" in text
    assert '    +     "train_micro_batch_size_per_gpu": 1,' in text
    markdown = render_markdown(r)
    assert "```diff\n" in markdown and '+     "gradient_accumulation_steps": 16,' in markdown
    assert r.to_dict()["smallest_fix"]["files"][0]["text"] == r.smallest_fix.files[0].after


def test_the_accelerate_yaml_and_training_args_change_in_place(tmp_path: Path) -> None:
    """accelerate's inline DeepSpeed config and a TrainingArguments JSON: each value changed on its own line, the
    YAML's comment kept; the command gains no --deepspeed (the YAML carries the strategy) and no batch flags (the
    JSON carries them)."""
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED  # ZeRO via accelerate\n"
                   "deepspeed_config:\n  gradient_accumulation_steps: 1\n  zero_stage: 2\n"
                   "  offload_optimizer_device: none\nmixed_precision: bf16\nnum_processes: 4\n")
    args = tmp_path / "training_args.json"
    args.write_text('{\n  "per_device_train_batch_size": 8,\n  "gradient_accumulation_steps": 1,\n  "bf16": true,\n'
                    '  "output_dir": "out"\n}\n')
    r = check_launch(LaunchInputs(command="accelerate launch --config_file accelerate.yaml train.py "
                                  "--max_seq_length 4096", accelerate_config=str(acc), training_args=str(args),
                                  model="llama-2-7b", gpu="a10g", command_dir=str(tmp_path)))
    files = {Path(f.path).name: f for f in r.smallest_fix.files}
    assert set(files) == {"accelerate.yaml", "training_args.json"}
    yaml_marks = [m for m in files["accelerate.yaml"].marked if m[0] in "+-"]
    assert yaml_marks == ["-   gradient_accumulation_steps: 1", "+   gradient_accumulation_steps: 8",
                          "-   offload_optimizer_device: none", "+   offload_optimizer_device: cpu"]
    assert "distributed_type: DEEPSPEED  # ZeRO via accelerate" in files["accelerate.yaml"].after
    json_marks = [m for m in files["training_args.json"].marked if m[0] in "+-"]
    assert json_marks == ['-   "per_device_train_batch_size": 8,', '+   "per_device_train_batch_size": 1,',
                          '-   "gradient_accumulation_steps": 1,', '+   "gradient_accumulation_steps": 8,']
    launch = r.smallest_fix.launch
    assert "--deepspeed" not in launch and "--per_device_train_batch_size" not in launch
    assert launch.endswith("--gradient_checkpointing")


def test_a_fitting_run_changes_no_file(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}')
    r = check_launch(LaunchInputs(command="deepspeed --num_gpus 2 train.py --deepspeed ds.json --bf16 "
                                  "--per_device_train_batch_size 1 --gradient_checkpointing --max_seq_length 512 "
                                  "--use_peft --lora_r 16", model="llama-2-7b", gpu="a100-80gb",
                                  command_dir=str(tmp_path)))
    assert r.smallest_fix is None and r.to_dict()["smallest_fix"] is None
