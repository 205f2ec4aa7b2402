"""Launch command lines: launcher, options, script and flags."""

import pytest

from oomlab.core.errors import InvalidValueError
from oomlab.launch.command import Launcher, parse_command


@pytest.mark.parametrize("text, launcher, script", [
    ("torchrun --nproc_per_node 4 train.py --fp16", Launcher.TORCHRUN, "train.py"),
    ("python -m torch.distributed.run --nproc-per-node=2 train.py", Launcher.TORCHRUN, "train.py"),
    ("accelerate launch --config_file a.yaml --num_processes 4 train.py", Launcher.ACCELERATE, "train.py"),
    ("accelerate launch --multi_gpu train.py --bf16", Launcher.ACCELERATE, "train.py"),  # a switch, no value
    ("deepspeed trainer_sft.py --configs defaults llama-13b --deepspeed", Launcher.DEEPSPEED, "trainer_sft.py"),
    ("CUDA_VISIBLE_DEVICES=0,1 python train.py", Launcher.PYTHON, "train.py"),
    ("python -m trl.scripts.sft --use_peft", Launcher.PYTHON, "trl.scripts.sft"),
    ("llamafactory-cli train config.yaml", Launcher.LLAMAFACTORY, "train"),
    ("axolotl train config.yml", Launcher.AXOLOTL, "train"),
    ("accelerate launch -m axolotl.cli.train config.yml", Launcher.ACCELERATE, "axolotl.cli.train"),
    ("python -m axolotl.cli.train config.yml", Launcher.PYTHON, "axolotl.cli.train"),
    ("trl dpo --model_name_or_path x", Launcher.TRL, "dpo"),
])
def test_launchers(text: str, launcher: Launcher, script: str) -> None:
    """Each launcher is recognised and the script found after its options."""
    cmd = parse_command(text)
    assert (cmd.launcher, cmd.script) == (launcher, script)


def test_flags_bare_valued_and_multiword() -> None:
    """A bare flag has no value; a flag followed by words keeps them all."""
    cmd = parse_command("deepspeed trainer_sft.py --configs defaults llama-13b --deepspeed --lr=1e-5")
    assert cmd.flags == (("--configs", "defaults llama-13b"), ("--deepspeed", None), ("--lr", "1e-5"))


def test_env_kept() -> None:
    """Environment assignments before the command are kept."""
    assert parse_command("CUDA_VISIBLE_DEVICES=0,1 OMP_NUM_THREADS=1 torchrun x.py").env == (
        ("CUDA_VISIBLE_DEVICES", "0,1"), ("OMP_NUM_THREADS", "1"))


def test_unknown_launcher_lists_known() -> None:
    """An unknown program is refused, listing the launchers read."""
    with pytest.raises(InvalidValueError, match="unknown launcher 'srun'.*known: torchrun"):
        parse_command("srun train.py")


@pytest.mark.parametrize("text, config, flags", [
    ("axolotl train examples/qlora.yml --micro_batch_size 1", "examples/qlora.yml", (("--micro_batch_size", "1"),)),
    ("accelerate launch -m axolotl.cli.train qlora.yml", "qlora.yml", ()),
    ("llamafactory-cli train x.yaml cutoff_len=4096 lora_target=q_proj,v_proj", "x.yaml",
     (("cutoff_len", "4096"), ("lora_target", "q_proj,v_proj"))),  # OmegaConf overrides
    ("llamafactory-cli train --stage sft --bf16", None, (("--stage", "sft"), ("--bf16", None))),
])
def test_framework_config_and_overrides(text: str, config: str | None, flags: tuple) -> None:
    """The config named after the script is its config; LLaMA-Factory's key=value words are flags named key."""
    cmd = parse_command(text)
    assert (cmd.config, cmd.flags) == (config, flags)


def test_a_framework_subcommand_that_does_not_train() -> None:
    """axolotl preprocess is refused, naming what is read."""
    with pytest.raises(InvalidValueError, match="'preprocess' does not train; oomlab reads axolotl train"):
        parse_command("axolotl preprocess config.yml")
