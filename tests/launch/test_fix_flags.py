"""The fix's flags spelled as each command spells them (oomlab.launch.fix_flags)."""

import pytest

from oomlab.launch.command import parse_command
from oomlab.launch.fix_flags import flag_style


@pytest.mark.parametrize("text, knob, value, expected", [
    ("torchrun train.py --max_length 2048", "seq", "1024", "torchrun train.py --max_length 1024"),
    ("python train.py --cutoff_len 2048", "seq", "1024", "python train.py --cutoff_len 1024"),
    ("python train.py --bf16", "seq", "1024", "python train.py --bf16 --max_seq_length 1024"),
    ("python train.py --bf16", "checkpointing", None, "python train.py --bf16 --gradient_checkpointing"),
    ("llamafactory-cli train x.yaml cutoff_len=4096", "seq", "1024", "llamafactory-cli train x.yaml cutoff_len=1024"),
    ("llamafactory-cli train x.yaml", "batch", "1", "llamafactory-cli train x.yaml per_device_train_batch_size=1"),
    ("llamafactory-cli train x.yaml", "checkpointing", None,
     "llamafactory-cli train x.yaml disable_gradient_checkpointing=false"),
    ("llamafactory-cli train --cutoff_len 4096", "seq", "1024", "llamafactory-cli train --cutoff_len 1024"),
    ("axolotl train x.yml", "batch", "1", "axolotl train x.yml --micro_batch_size 1"),
    ("axolotl train x.yml", "checkpointing", None, "axolotl train x.yml --gradient_checkpointing true"),
    ("axolotl train x.yml", "optim", "adamw_bnb_8bit", "axolotl train x.yml --optimizer adamw_bnb_8bit"),
    ("trl dpo --model_name_or_path m", "seq", "512", "trl dpo --model_name_or_path m --max_length 512"),
])
def test_set(text: str, knob: str, value: str | None, expected: str) -> None:
    """A knob set on the user's own command: replaced where given, else added in the command's own spelling."""
    assert flag_style(parse_command(text)).set(text, knob, value) == expected
