"""LLaMA-Factory's launch read (oomlab.launch.llamafactory): its example YAML and its flags, every decisive field
with its origin, its defaults cited at v0.9.5, and check's verdict on them."""

import os
from pathlib import Path

import pytest

from oomlab.core.choices import Attention, Method, Optimizer, Precision, Reference, Strategy, Trainer
from oomlab.core.errors import InvalidValueError, LaunchFileError, UnknownNameError
from oomlab.launch.check import check
from oomlab.launch.command import Launcher
from oomlab.launch.inputs import check_inputs
from oomlab.launch.origin import OriginKind
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch

FIXTURE = Path(__file__).parents[1] / "fixtures" / "llamafactory"
YAML = FIXTURE / "yaml" / "qwen3_lora_sft.yaml"
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # qwen3's linear layers


def _read(folder: str, **kwargs):
    return read_launch(check_inputs(launch_dir=FIXTURE / folder, model="qwen3-8b", gpu="a10g", **kwargs))


def test_readme_cites_the_source() -> None:
    """The fixture's README names the repository, the tag and the files copied."""
    text = (FIXTURE / "README.md").read_text()
    assert "hiyouga/LLaMA-Factory" in text and "v0.9.5" in text and "examples/train_lora/qwen3_lora_sft.yaml" in text


def test_the_yaml_example_every_decisive_field() -> None:
    """llamafactory-cli train qwen3_lora_sft.yaml: each field the YAML states comes from its line, the rest from
    LLaMA-Factory's (or transformers') default, said so."""
    launch = _read("yaml")
    f, s = launch.fields, launch.setup
    assert launch.launcher is Launcher.LLAMAFACTORY and launch.hf_trainer
    where = str(YAML)
    expected = {
        "trainer": (Trainer.SFT, f"{where}:6 stage"),
        "method": (Method.LORA, f"{where}:8 finetuning_type"),
        "lora_rank": (8, f"{where}:9 lora_rank"),
        "lora_targets": (ALL, f"{where}:10 lora_target"),
        "seq": (2048, f"{where}:15 cutoff_len"),
        "batch": (1, f"{where}:30 per_device_train_batch_size"),
        "accumulation": (8, f"{where}:31 gradient_accumulation_steps"),
        "precision": (Precision.BF16_MIXED, f"{where}:36 bf16"),
    }
    for name, (value, origin) in expected.items():
        assert (f[name].value, str(f[name].origin)) == (value, origin), name
    assert f["lora_alpha"].value == 16 and "finetuning_args.py:568" in str(f["lora_alpha"].origin)
    assert f["checkpointing"].value is True
    assert str(f["checkpointing"].origin) == (
        "default of LLaMA-Factory 0.9.5 (gradient checkpointing on unless disable_gradient_checkpointing "
        "(model/model_utils/checkpointing.py:164))")
    assert f["attention"].value is Attention.SDPA and "attention.py:65" in str(f["attention"].origin)
    assert f["load_dtype"].value == "bfloat16" and "parser.py:512-515" in str(f["load_dtype"].origin)
    assert f["optimizer"].value is Optimizer.ADAMW_FUSED and f["optimizer"].origin.kind is OriginKind.DEFAULT
    assert (s.strategy, s.method, s.lora_targets, s.seq, s.batch, s.trainer) == (
        Strategy.SINGLE, Method.LORA, ALL, 2048, 1, Trainer.SFT)
    assert "quantization" not in f  # no quantization_bit: a bf16 base
    assert launch.files == (where,)


def test_the_flags_example_reads_the_same_run() -> None:
    """qwen3_lora_sft.sh's flags give the same setup as its YAML, each field from its flag."""
    yaml_launch, flags_launch = _read("yaml"), _read("cli")
    assert flags_launch.setup == yaml_launch.setup
    f = flags_launch.fields
    assert str(f["seq"].origin) == "flag --cutoff_len 2048"
    assert str(f["lora_targets"].origin) == "flag --lora_target all"
    assert str(f["method"].origin) == "flag --finetuning_type lora"
    assert str(f["trainer"].origin) == "flag --stage sft"
    assert str(f["precision"].origin) == "flag --bf16"


def test_overrides_after_the_yaml_win_and_are_said() -> None:
    """key=value after the YAML replaces its key (OmegaConf.merge); the YAML's value is listed as overridden."""
    launch = read_launch(LaunchInputs(command=f"llamafactory-cli train {YAML} cutoff_len=4096 "
                                      "disable_gradient_checkpointing=true", model="qwen3-8b", gpu="a10g"))
    assert (launch.fields["seq"].value, str(launch.fields["seq"].origin)) == (4096, "flag cutoff_len=4096")
    assert launch.fields["checkpointing"].value is False
    overridden = [u for u in launch.unmodelled if u.origin.key == "cutoff_len"]
    assert overridden and "overridden by flag cutoff_len=4096" in overridden[0].why


@pytest.mark.parametrize("flags, field, value", [
    ("--stage dpo", "trainer", Trainer.DPO),
    ("--stage dpo --pref_loss orpo", "trainer", Trainer.ORPO),  # no reference model (finetuning_args.py:574)
    ("--stage kto", "trainer", Trainer.KTO),
    ("--stage rm", "trainer", Trainer.REWARD),
    ("--stage pt", "trainer", Trainer.SFT),
    ("--finetuning_type full", "method", Method.FULL),
    ("--quantization_bit 4 --bf16", "method", Method.QLORA),
    ("--lora_target q_proj,v_proj", "lora_targets", ("q_proj", "v_proj")),
    ("--lora_rank 16", "lora_alpha", 32),  # alpha = 2 x rank when unset
    ("--flash_attn disabled", "attention", Attention.EAGER),
    ("--pure_bf16", "precision", Precision.BF16),
    ("--fp16", "load_dtype", "float16"),
])
def test_flags(flags: str, field: str, value) -> None:
    """Each LLaMA-Factory flag reaches its field."""
    launch = read_launch(LaunchInputs(command=f"llamafactory-cli train --model_name_or_path x {flags}",
                                      model="qwen3-8b", gpu="a10g"))
    assert launch.fields[field].value == value


def test_defaults_when_nothing_is_said() -> None:
    """The bare command: LoRA r8 over every linear layer at 2048 tokens with checkpointing, SFT -- LLaMA-Factory's
    defaults, each citing its line."""
    launch = read_launch(LaunchInputs(command="llamafactory-cli train --model_name_or_path x", model="qwen3-8b",
                                      gpu="a10g"))
    f = launch.fields
    assert (f["method"].value, f["lora_rank"].value, f["lora_targets"].value, f["seq"].value,
            f["checkpointing"].value, f["trainer"].value) == (Method.LORA, 8, ALL, 2048, True, Trainer.SFT)
    assert "finetuning_args.py:464-465" in str(f["method"].origin)
    assert "data_args.py:46-47" in str(f["seq"].origin)
    assert "finetuning_args.py:460-461" in str(f["trainer"].origin)


def test_nproc_per_node_and_nnodes() -> None:
    """NPROC_PER_NODE and NNODES in front of llamafactory-cli are its torchrun's processes and nodes."""
    launch = read_launch(LaunchInputs(command="NNODES=2 NPROC_PER_NODE=4 llamafactory-cli train --model_name_or_path "
                                      "x --deepspeed zero3_config_sft.json", model="qwen3-8b", gpu="a10g",
                                      deepspeed=str(Path(__file__).parents[1] / "fixtures" / "open-assistant" /
                                                    "zero3" / "zero3_config_sft.json")))
    assert (launch.setup.gpus, launch.setup.nodes, launch.setup.strategy) == (4, 2, Strategy.ZERO3)
    assert "NPROC_PER_NODE=4" in str(launch.fields["gpus"].origin)


@pytest.mark.parametrize("flags, error, match", [
    ("--finetuning_type freeze", UnknownNameError, "finetuning_type.*freeze.*known: full, lora"),
    ("--quantization_bit 8", InvalidValueError, "8-bit base"),
    ("--quantization_bit 3", InvalidValueError, "quantization_bit 3 is not budgeted"),
    ("--stage sft2", UnknownNameError, "stage.*sft2"),
    ("--flash_attn fa9", UnknownNameError, "flash_attn.*fa9"),
])
def test_refused(flags: str, error: type, match: str) -> None:
    """What oomlab does not budget is refused naming the value and the accepted ones."""
    with pytest.raises(error, match=match):
        read_launch(LaunchInputs(command=f"llamafactory-cli train --model_name_or_path x {flags}", model="qwen3-8b",
                                 gpu="a10g"))


def test_other_subcommands_are_refused() -> None:
    """llamafactory-cli chat does not train."""
    with pytest.raises(InvalidValueError, match="does not train.*llamafactory-cli train"):
        read_launch(LaunchInputs(command="llamafactory-cli chat x.yaml", model="qwen3-8b", gpu="a10g"))


@pytest.mark.heavy
def test_check_gives_a_verdict_end_to_end() -> None:
    """check on the YAML example: Qwen3-8B LoRA at 2048 tokens on one A10G loads and is judged with its margin;
    --seq 4096 --batch 4 makes it fail in the step, and the fix writes LLaMA-Factory's own overrides."""
    r = check(launch_dir=str(FIXTURE / "yaml"), model="qwen3-8b", gpu="a10g")
    assert r.load.fits and r.to_dict()["verdict"] in ("fits", "tight")
    worse = check(launch_dir=str(FIXTURE / "yaml"), model="qwen3-8b", gpu="a10g", seq=4096, batch=4)
    assert worse.to_dict()["verdict"] == "does not fit" and worse.fails_at is not None
    assert str(worse.launch.fields["seq"].origin) == "flag --seq 4096 (given on the command line)"
    assert worse.smallest_fix is not None
    assert worse.smallest_fix.launch.startswith("llamafactory-cli train qwen3_lora_sft.yaml ")
    assert "--max_seq_length" not in worse.smallest_fix.launch  # LLaMA-Factory's own key=value, not a foreign flag


def test_deepspeed_json_named_by_the_yaml(tmp_path: Path) -> None:
    """deepspeed: ds_z3_config.json in the YAML (as examples/train_lora/qwen3_lora_sft_ds3.yaml names one) is read
    beside the command: ZeRO-3 from the JSON's stage, over NPROC_PER_NODE processes."""
    (tmp_path / "ds_z3_config.json").write_text('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}, '
                                                '"train_micro_batch_size_per_gpu": "auto"}')
    (tmp_path / "sft.yaml").write_text(YAML.read_text() + "deepspeed: ds_z3_config.json\n")
    (tmp_path / "launch.txt").write_text("NPROC_PER_NODE=2 llamafactory-cli train sft.yaml\n")
    launch = read_launch(check_inputs(launch_dir=tmp_path, model="qwen3-8b", gpu="a10g"))
    assert (launch.setup.strategy, launch.setup.gpus, launch.setup.precision) == (Strategy.ZERO3, 2,
                                                                                  Precision.BF16_MIXED)
    assert str(launch.fields["strategy"].origin).endswith("ds_z3_config.json:1 zero_optimization.stage")


@pytest.mark.parametrize("flags, on", [
    ("--gradient_checkpointing false", True),  # the Trainer's flag cannot switch LLaMA-Factory's off
    ("--disable_gradient_checkpointing", False),
    ("--disable_gradient_checkpointing --gradient_checkpointing", True),  # the Trainer switches it on anyway
])
def test_checkpointing_as_llamafactory_decides(flags: str, on: bool) -> None:
    """Checkpointing is on unless disable_gradient_checkpointing, and then only the Trainer's own flag enables it."""
    launch = read_launch(LaunchInputs(command=f"llamafactory-cli train --model_name_or_path x {flags}",
                                      model="qwen3-8b", gpu="a10g"))
    assert launch.fields["checkpointing"].value is on


def test_the_yaml_is_read_bounded(tmp_path: Path) -> None:
    """The config is read as every launch file: a YAML alias (the seed of an alias bomb) and a FIFO are refused
    naming the file, never expanded or waited on."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [1, 2]\nb: [*a, *a]\n")
    with pytest.raises(LaunchFileError, match="bomb.yaml"):
        read_launch(LaunchInputs(command=f"llamafactory-cli train {bomb}", model="qwen3-8b", gpu="a10g"))
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(LaunchFileError, match="fifo.yaml"):
        read_launch(LaunchInputs(command=f"axolotl train {fifo}", model="qwen3-8b", gpu="a10g"))


def test_a_separate_reference_model_is_resident() -> None:
    """stage dpo with ref_model: LLaMA-Factory loads that model frozen beside the trained one."""
    launch = read_launch(LaunchInputs(command="llamafactory-cli train --model_name_or_path x --stage dpo "
                                      "--ref_model y", model="qwen3-8b", gpu="a10g"))
    assert (launch.setup.trainer, launch.setup.reference) == (Trainer.DPO, Reference.RESIDENT)
    assert str(launch.fields["reference"].origin) == "flag --ref_model y"
