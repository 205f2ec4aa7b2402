"""A custom script's launch (Stanford Alpaca's train.py): the sequence length and optimizer its own source defaults
(oomlab.launch.script_defaults, read by ast, never run), the length flags scripts spell their own way, and check's
verdict and --seq/--batch overrides on it."""

from pathlib import Path

import pytest

from oomlab.core.choices import Method, Optimizer, Precision, Strategy, Trainer
from oomlab.core.models import ALL_LINEAR
from oomlab.launch.check import check
from oomlab.launch.inputs import check_inputs
from oomlab.launch.origin import OriginKind
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch
from oomlab.launch.script_defaults import script_defaults

FIXTURE = Path(__file__).parents[1] / "fixtures" / "custom-script"
SCRIPT = FIXTURE / "train.py"


def test_readme_cites_the_source() -> None:
    """The fixture's README names the repository, the commit and the README lines of the command."""
    text = (FIXTURE / "README.md").read_text()
    assert "tatsu-lab/stanford_alpaca" in text and "761dc5bfbdeeffa89b8bff5d038781a4055f796a" in text


def test_script_defaults_from_the_source() -> None:
    """train.py's TrainingArguments subclass: optim 'adamw_torch' (line 59) and model_max_length 512 (line 60)."""
    assert script_defaults(SCRIPT) == {"optim": ("adamw_torch", 59), "model_max_length": (512, 60)}


def test_argparse_defaults(tmp_path: Path) -> None:
    """An argparse script's --max_length and --batch_size... defaults, by the option's own name."""
    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--max-length', type=int, default=1024)\n"
                      "p.add_argument('--micro_batch_size', type=int, default=4)\n"
                      "p.add_argument('--lr', type=float, default=1e-4)\n")
    assert script_defaults(script) == {"max_length": (1024, 3), "micro_batch_size": (4, 4)}


def test_unparsable_script_says_nothing(tmp_path: Path) -> None:
    """A script that is not Python oomlab can parse gives no defaults (the launch is still read)."""
    script = tmp_path / "train.py"
    script.write_text("def (:\n")
    assert script_defaults(script) == {}


def test_the_alpaca_launch_every_decisive_field() -> None:
    """The README's torchrun command: FSDP over 4 processes, bf16, 4 x 8 accumulation; the length and the optimizer
    from train.py's own defaults, with their lines."""
    launch = read_launch(check_inputs(launch_dir=FIXTURE, model="llama-7b", gpu="a100-80gb"))
    f, s = launch.fields, launch.setup
    expected = {
        "gpus": (4, "flag --nproc_per_node 4"),
        "precision": (Precision.BF16_MIXED, "flag --bf16 True"),
        "batch": (4, "flag --per_device_train_batch_size 4"),
        "accumulation": (8, "flag --gradient_accumulation_steps 8"),
        "seq": (512, f"{SCRIPT}:60 model_max_length default"),
        "optimizer": (Optimizer.ADAMW, f"{SCRIPT}:59 optim default"),
        "strategy": (Strategy.FSDP2, "flag --fsdp full_shard auto_wrap"),
    }
    for name, (value, origin) in expected.items():
        assert (f[name].value, str(f[name].origin)) == (value, origin), name
    assert f["seq"].origin.kind is OriginKind.FILE
    assert (f["method"].value, f["checkpointing"].value) == (Method.FULL, False)
    assert f["trainer"].value is Trainer.SFT and f["trainer"].origin.kind is OriginKind.ASSUMED
    assert s.world_size == 4


def test_a_flag_beats_the_scripts_default() -> None:
    """--model_max_length on the command line decides; the script's default is not read for it."""
    launch = read_launch(LaunchInputs(command="torchrun --nproc_per_node 4 train.py --model_max_length 2048 --bf16",
                                      model="llama-7b", gpu="a100-80gb", command_dir=str(FIXTURE)))
    assert (launch.fields["seq"].value, str(launch.fields["seq"].origin)) == (2048, "flag --model_max_length 2048")
    assert launch.fields["optimizer"].value is Optimizer.ADAMW  # still the script's optim default


@pytest.mark.parametrize("flags, seq", [
    ("--cutoff_len 512", 512),  # alpaca-lora's finetune.py
    ("--max_length 1024", 1024),
    ("--block_size 256", 256),
    ("--seq_len 1536", 1536),
    ("--max_source_length 1024 --max_target_length 512", 1536),  # prompt + answer, concatenated
])
def test_script_length_flags(flags: str, seq: int) -> None:
    """Each spelling of a custom script's length flag is the sequence length."""
    launch = read_launch(LaunchInputs(command=f"python finetune.py {flags}", model="llama-7b", gpu="a100-80gb"))
    assert launch.fields["seq"].value == seq


def test_alpaca_lora_flags() -> None:
    """alpaca-lora's finetune.py README command: --micro_batch_size, --cutoff_len, --base_model and the bracketed
    --lora_target_modules are read."""
    command = ("python finetune.py --base_model 'decapoda-research/llama-7b-hf' --data_path 'yahma/alpaca-cleaned' "
               "--output_dir './lora-alpaca' --batch_size 128 --micro_batch_size 4 --num_epochs 3 "
               "--learning_rate 1e-4 --cutoff_len 512 --val_set_size 2000 --lora_r 8 --lora_alpha 16 "
               "--lora_dropout 0.05 --lora_target_modules '[q_proj,v_proj]' --train_on_inputs --group_by_length")
    f = read_launch(LaunchInputs(command=command, model="llama-7b", gpu="a100-80gb")).fields
    assert (f["batch"].value, f["seq"].value, f["lora_targets"].value) == (4, 512, ("q_proj", "v_proj"))
    assert str(f["batch"].origin) == "flag --micro_batch_size 4"


def test_targets_all_linear_kept() -> None:
    """all-linear stays the one name (not split), then every linear layer of the model."""
    f = read_launch(LaunchInputs(command="python t.py --use_peft --lora_target_modules all-linear",
                                 model="llama-7b", gpu="a100-80gb")).fields
    assert f["lora_targets"].value == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert ALL_LINEAR == "all-linear"


def test_check_verdict_and_overrides_end_to_end() -> None:
    """check on the Alpaca launch gives a verdict; --seq and --batch given on the command line decide, the command's
    stated batch listed as overridden (the script's default length gives way silently, as every default does)."""
    r = check(launch_dir=str(FIXTURE), model="llama-7b", gpu="a100-80gb")
    assert r.to_dict()["verdict"] in ("fits", "tight", "does not fit")
    given = check(launch_dir=str(FIXTURE), model="llama-7b", gpu="a100-80gb", seq=2048, batch=8)
    f = given.launch.fields
    assert (f["seq"].value, str(f["seq"].origin)) == (2048, "flag --seq 2048 (given on the command line)")
    assert (f["batch"].value, str(f["batch"].origin)) == (8, "flag --batch 8 (given on the command line)")
    assert given.budget.per_gpu_peak_bytes > r.budget.per_gpu_peak_bytes
    overridden = {u.origin.where: u.why for u in given.launch.unmodelled if "given on the command line" in u.why}
    assert overridden == {"--per_device_train_batch_size 4": "overridden by flag --batch 8 (given on the command line)"}
