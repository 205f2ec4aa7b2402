"""The run's setup record: every launch read back from ``results/setup.json`` equals the launch read (setup, every
field with its origin, DeepSpeed knobs, command, what was not modelled), without reading the user's files again."""

import json
import shutil
from pathlib import Path

import pytest

from oomlab.core.errors import InvalidValueError
from oomlab.launch.inputs import check_inputs
from oomlab.launch.record import launch_of, launch_record, read_launch_record, write_launch
from oomlab.launch.resolve import read_launch
from oomlab.launch.user import user_launch
from oomlab.pipeline.params import PARAMETERS, parse_params

DEFAULTS = {name: p.default for name, p in PARAMETERS.items()}
TWIN = Path(__file__).parents[1] / "fixtures" / "open-assistant"
CONFIG = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 512,
          "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
          "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def _cases(tmp: Path) -> dict:
    config = tmp / "config.json"
    config.write_text(json.dumps(CONFIG))
    return {
        "parameters": user_launch(parse_params([]), DEFAULTS),
        "one gpu, lora": user_launch(parse_params(["gpus=1", "method=lora", "lora_rank=16"]), DEFAULTS),
        "twin zero2": user_launch(parse_params([f"launch_dir={TWIN / 'seed'}"]), DEFAULTS),
        "twin zero3": read_launch(check_inputs(launch_dir=TWIN / "zero3", model="llama-13b", gpu="t4", gpus=4)),
        "command + config.json": read_launch(check_inputs(
            launch="torchrun --nproc_per_node 2 train.py --bf16 --per_device_train_batch_size 2 --max_seq_length 1024"
                   " --gradient_checkpointing --optim adamw_bnb_8bit --foo 3",
            model=str(config), gpu="a10g")),
    }


def test_every_launch_reads_back_equal(tmp_path: Path) -> None:
    """Round trip through JSON text: the same UserLaunch, field by field (a model given as a config.json keeps its
    fields: the file is deleted before reading back)."""
    for name, launch in _cases(tmp_path).items():
        text = json.dumps(launch_record(launch))
        (tmp_path / "config.json").unlink(missing_ok=True)
        back = launch_of(json.loads(text))
        assert back.setup == launch.setup, name
        assert back.fields == launch.fields, name
        kept = ("deepspeed", "launcher", "hf_trainer", "command", "unmodelled", "files")
        assert [getattr(back, k) for k in kept] == [getattr(launch, k) for k in kept], name
        assert back.to_dict() == launch.to_dict(), name


def test_the_record_is_read_from_a_copy_without_the_launch_dir(tmp_path: Path) -> None:
    """A recorded launch_dir run reads back after its folder is gone: nothing re-reads the user's files."""
    folder = tmp_path / "launch"
    shutil.copytree(TWIN / "seed", folder)
    launch = user_launch(parse_params([f"launch_dir={folder}"]), DEFAULTS)
    path = write_launch(tmp_path / "setup.json", launch)
    shutil.rmtree(folder)
    assert read_launch_record(path).setup == launch.setup


def test_another_version_is_refused(tmp_path: Path) -> None:
    record = launch_record(user_launch(parse_params([]), DEFAULTS))
    with pytest.raises(InvalidValueError, match="version 0"):
        launch_of({**record, "version": 0})
