"""DeepSpeed's batch arithmetic: train_batch_size = micro-batch × gradient_accumulation_steps × world size."""

import json
from pathlib import Path

import pytest

from oomlab.core.errors import LaunchConflictError
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch


def _launch(tmp_path: Path, config: dict, command: str = "deepspeed --num_gpus 4 train.py", **kw):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({**config, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, indent=2))
    return read_launch(LaunchInputs(command=command, deepspeed=str(ds), model="llama-2-7b", gpu="a100-80gb", **kw))


@pytest.mark.parametrize(("config", "command", "micro"), [
    ({"train_batch_size": 8}, "deepspeed --num_gpus 4 train.py", 2),  # the case: 8 / (4 × 1)
    ({"train_batch_size": 8}, "deepspeed --num_gpus 4 train.py --output_dir out", 2),  # not the Trainer's default 8
    ({"train_batch_size": 32, "gradient_accumulation_steps": 4}, "deepspeed --num_gpus 4 train.py", 2),
    ({"train_batch_size": 16}, "deepspeed --num_gpus 4 --num_nodes 2 train.py", 2),  # world size 8
    ({"train_batch_size": 16, "gradient_accumulation_steps": "auto"},  # "auto" filled from the Trainer's flag
     "deepspeed --num_gpus 4 train.py --gradient_accumulation_steps 2", 2),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}, "deepspeed --num_gpus 4 train.py", 2),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2},
     "deepspeed --num_gpus 4 train.py", 2),
    ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"},  # the Trainer's flag decides
     "deepspeed --num_gpus 4 train.py --per_device_train_batch_size 3", 3),
])
def test_micro_batch_from_the_batch_arithmetic(tmp_path: Path, config: dict, command: str, micro: int) -> None:
    """The micro-batch DeepSpeed trains with, from whichever batch keys the JSON gives and the world size."""
    assert _launch(tmp_path, config, command).setup.batch == micro


def test_derived_micro_batch_says_its_arithmetic(tmp_path: Path) -> None:
    """The micro-batch's origin names train_batch_size's line and the division."""
    launch = _launch(tmp_path, {"train_batch_size": 8})
    assert str(launch.fields["batch"].origin) == (
        f"{tmp_path / 'ds.json'}:2 train_batch_size 8 / (4 processes × 1 accumulation step)")
    assert not [u for u in launch.unmodelled if "train_batch_size" in str(u.origin)]


@pytest.mark.parametrize(("config", "command", "message"), [
    ({"train_batch_size": 6}, "deepspeed --num_gpus 4 train.py",
     r"contradiction in batch: .*ds\.json:2 train_batch_size says 6, which 1 accumulation steps .* × world size 4 "
     r"\(4 processes per node \(flag --num_gpus 4\)\) do not divide; DeepSpeed refuses it"),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}, "deepspeed --num_gpus 4 train.py",
     r"contradiction in batch: .*ds\.json:2 train_batch_size says 8 but .*ds\.json:3 train_micro_batch_size_per_gpu"
     r" 4 × 1 accumulation steps .* is 16; DeepSpeed refuses it \(runtime/config\.py _batch_assertion\)"),
    ({"train_batch_size": 8}, "deepspeed --num_gpus 4 train.py --per_device_train_batch_size 4",
     r"contradiction in batch: .*ds\.json:2 train_batch_size says 8, a micro-batch of 2 .* but flag "
     r"--per_device_train_batch_size 4 says 4"),
    ({"gradient_accumulation_steps": 2}, "deepspeed --num_gpus 4 train.py --gradient_accumulation_steps 4",
     r"contradiction in gradient_accumulation_steps: .*ds\.json:2 gradient_accumulation_steps says 2 but flag "
     r"--gradient_accumulation_steps 4 says 4; the HF Trainer refuses it"),
])
def test_batch_contradictions_name_both_places(tmp_path: Path, config: dict, command: str, message: str) -> None:
    """A train_batch_size that does not multiply out is refused, as DeepSpeed refuses it, naming both places."""
    with pytest.raises(LaunchConflictError, match=message):
        _launch(tmp_path, config, command)
