"""LAUNCH.md read as a user reads it, independently of the code that writes it: every command it gives parses with
accelerate's own ``accelerate launch`` parser and the written ``train.py``'s own parser, names files that are in the
folder, and agrees with the YAML configs it launches; the table names files that exist; the prose counts right."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

from oomlab.remedies import launch_writer
from oomlab.remedies.plan import make_plan

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


CASES = {
    "seed": ({}, 4),  # llama-13b on 4 x T4: DeepSpeed commands
    "fsdp2": ({"model": "llama-7b", "gpu": "a10g", "gpus": 4}, 4),  # an FSDP2 command among them
    "ddp": ({"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 2}, 2),  # a DDP command among them
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory) -> tuple[Path, int]:
    """A plan written as a user receives it, and its GPU count."""
    kwargs, gpus = CASES[request.param]
    out = tmp_path_factory.mktemp(f"configs-{request.param}")
    launch_writer.write_configs(out, make_plan(**kwargs))
    return out, gpus


@pytest.fixture(scope="module")
def folder(case) -> Path:
    return case[0]


@pytest.fixture(scope="module")
def doc(folder: Path) -> str:
    return (folder / "LAUNCH.md").read_text()


@pytest.fixture(scope="module")
def train_parser(folder: Path):
    """The written train.py's own ``parse_args`` (the file the user runs, loaded from the folder)."""
    spec = importlib.util.spec_from_file_location("written_train", folder / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_args


def commands(doc: str) -> list[list[str]]:
    return [shlex.split(block.replace("\\\n", " ")) for block in FENCE.findall(doc)]


def test_every_heading_has_one_command(doc: str) -> None:
    """One ## section per launch, each with exactly one fenced command."""
    sections = re.split(r"^## ", doc, flags=re.MULTILINE)[1:]
    assert sections and all(len(FENCE.findall(section)) == 1 for section in sections)


def test_commands_parse_with_accelerate_and_train_py(doc: str, case, train_parser) -> None:
    """accelerate's launch parser takes the launcher's options, train.py's parser the script's; the config exists,
    launches the plan's GPU count, and the model is the one the doc names."""
    from accelerate.commands.launch import launch_command_parser

    folder, gpus = case
    model = re.search(r"^Model: `([^`]+)`", doc, flags=re.MULTILINE).group(1)
    parser = launch_command_parser()
    found = commands(doc)
    assert found
    for words in found:
        assert words[:2] == ["accelerate", "launch"]
        script = words.index("train.py")
        launch_args = parser.parse_args([*words[2:script], "train.py"])
        assert Path(launch_args.config_file).name == launch_args.config_file
        assert (folder / launch_args.config_file).is_file(), launch_args.config_file
        args = train_parser(words[script + 1:])  # SystemExit (exit 2) on an unknown flag or a bad choice
        assert args.model == model and args.seq == 2048
        config = yaml.safe_load((folder / launch_args.config_file).read_text())
        assert launch_args.num_processes == config["num_processes"] == gpus
        if config.get("deepspeed_config", {}).get("deepspeed_config_file"):
            assert (folder / config["deepspeed_config"]["deepspeed_config_file"]).is_file()


def test_table_names_files_in_the_folder(doc: str, folder: Path) -> None:
    """Every config the table names is in the folder, and every accelerate config in the folder is in the table."""
    named = set(re.findall(r"^\| `([^`]+\.(?:yaml|json))`", doc, flags=re.MULTILINE))
    named |= set(re.findall(r"\(→ `([^`]+\.json)`\)", doc))
    assert named and all((folder / name).is_file() for name in named)
    assert {p.name for p in folder.glob("accelerate_*.yaml")} <= named


def test_prose_counts_processes_and_machines(doc: str, case) -> None:
    """The plan's GPUs on one machine, worded right (never "1 processes" or "1 machines")."""
    assert f"{case[1]} processes per machine on 1 machine," in doc
    assert not re.search(r"\b1 (?:processes|machines|GPUs)\b", doc)


def test_the_seeds_model(tmp_path: Path) -> None:
    """The seed's commands train huggyllama/llama-13b, the hub id of its spec."""
    launch_writer.write_configs(tmp_path, make_plan())
    assert all(words[words.index("--model") + 1] == "huggyllama/llama-13b"
               for words in commands((tmp_path / "LAUNCH.md").read_text()))


def test_one_gpu_prose_is_singular(tmp_path: Path) -> None:
    """A one-GPU plan's LAUNCH.md says 1 process."""
    launch_writer.write_configs(tmp_path, make_plan(model="llama-2-7b", gpu="a100-80gb", gpus=1))
    doc = (tmp_path / "LAUNCH.md").read_text()
    assert "1 process per machine on 1 machine," in doc
