"""Which framework a command runs (oomlab.launch.framework), and the framework launches' record read back equal."""

import json
from pathlib import Path

import pytest

from oomlab.launch.command import parse_command
from oomlab.launch.framework import Framework, framework_of
from oomlab.launch.inputs import check_inputs
from oomlab.launch.record import launch_of, launch_record
from oomlab.launch.resolve import read_launch

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.mark.parametrize("text, framework", [
    ("llamafactory-cli train x.yaml", Framework.LLAMAFACTORY),
    ("axolotl train x.yml", Framework.AXOLOTL),
    ("accelerate launch -m axolotl.cli.train x.yml", Framework.AXOLOTL),
    ("python -m axolotl.cli.train x.yml", Framework.AXOLOTL),
    ("trl sft --model_name_or_path m", Framework.TRL),
    ("python trl/scripts/dpo.py --model_name_or_path m", Framework.TRL),
    ("accelerate launch examples/scripts/grpo.py", Framework.TRL),
    ("python -m trl.scripts.kto", Framework.TRL),
    ("python train.py --max_length 512", None),  # a custom script: read as a transformers-style script
    ("python scripts/dpo.py", None),  # a dpo.py outside TRL's folders is the user's own
])
def test_framework_of(text: str, framework: Framework | None) -> None:
    """Each command's framework, by its program or its script's place."""
    assert framework_of(parse_command(text)) is framework


@pytest.mark.parametrize("folder, model, gpu", [
    ("llamafactory/yaml", "qwen3-8b", "a10g"), ("axolotl", "llama-3.1-8b", "t4"), ("trl-dpo", "qwen2.5-0.5b", "a10g"),
    ("custom-script", "llama-7b", "a100-80gb"),
])
def test_the_record_reads_back_equal(folder: str, model: str, gpu: str) -> None:
    """The pipeline's setup record of each framework launch (trainer, reference, the command's config) reads back
    equal."""
    launch = read_launch(check_inputs(launch_dir=FIXTURES / folder, model=model, gpu=gpu))
    assert launch_of(json.loads(json.dumps(launch_record(launch)))) == launch
