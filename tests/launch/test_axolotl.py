"""axolotl's launch read (oomlab.launch.axolotl): its examples/llama-3/qlora.yml under each of its three commands,
every decisive field with its origin, its defaults cited at v0.18.0, and check's verdict."""

from pathlib import Path

import pytest

from oomlab.core.choices import Attention, Method, Optimizer, Precision, Reference, Strategy, Trainer
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.launch.check import FailsAt, check
from oomlab.launch.command import Launcher
from oomlab.launch.inputs import check_inputs
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch

FIXTURE = Path(__file__).parents[1] / "fixtures" / "axolotl"
YAML = FIXTURE / "qlora.yml"
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yml"
    path.write_text("base_model: NousResearch/Meta-Llama-3-8B\n" + text)
    return str(path)


def test_readme_cites_the_source() -> None:
    """The fixture's README names the repository, the tag and the file copied."""
    text = (FIXTURE / "README.md").read_text()
    assert "axolotl-ai-cloud/axolotl" in text and "v0.18.0" in text and "examples/llama-3/qlora.yml" in text


def test_the_qlora_example_every_decisive_field() -> None:
    """axolotl train qlora.yml on a T4: each field from its line of the YAML; bf16 'auto' resolved as axolotl does on
    a GPU without bf16 (fp16), the load dtype following it."""
    launch = read_launch(check_inputs(launch_dir=FIXTURE, model="llama-3.1-8b", gpu="t4"))
    f, s = launch.fields, launch.setup
    where = str(YAML)
    expected = {
        "method": (Method.QLORA, f"{where}:9 load_in_4bit"),
        "quantization": (4, f"{where}:9 load_in_4bit"),
        "lora_rank": (32, f"{where}:25 lora_r"),
        "lora_alpha": (16, f"{where}:26 lora_alpha"),
        "lora_targets": (ALL, f"{where}:28 lora_target_linear"),
        "seq": (4096, f"{where}:21 sequence_len"),
        "batch": (2, f"{where}:37 micro_batch_size"),
        "accumulation": (4, f"{where}:36 gradient_accumulation_steps"),
        "optimizer": (Optimizer.ADAMW, f"{where}:39 optimizer"),  # paged_adamw_32bit: two fp32 moments
        "checkpointing": (True, f"{where}:46 gradient_checkpointing"),
        "attention": (Attention.SDPA, f"{where}:49 attn_implementation"),
    }
    for name, (value, origin) in expected.items():
        assert (f[name].value, str(f[name].origin)) == (value, origin), name
    assert str(f["method"].also[0]) == f"{where}:18 adapter"
    assert f["precision"].value is Precision.FP16_MIXED
    assert "bf16='auto': t4 lacks bf16" in str(f["precision"].origin)
    assert "utils/config/__init__.py:156-167" in str(f["precision"].origin)
    assert f["load_dtype"].value == "float16"
    assert f["trainer"].value is Trainer.SFT and "config.py:262-263" in str(f["trainer"].origin)
    assert launch.launcher is Launcher.AXOLOTL and s.strategy is Strategy.SINGLE
    sample_packing = next(u for u in launch.unmodelled if u.origin.key == "sample_packing")
    assert "sequence_len" in sample_packing.why


def test_bf16_auto_on_a_gpu_with_bf16() -> None:
    """The same YAML on an A100: bf16 'auto' is bf16, the model loaded in bf16."""
    launch = read_launch(check_inputs(launch_dir=FIXTURE, model="llama-3.1-8b", gpu="a100-80gb"))
    assert launch.fields["precision"].value is Precision.BF16_MIXED
    assert launch.fields["load_dtype"].value == "bfloat16"


@pytest.mark.parametrize("command", [
    "accelerate launch -m axolotl.cli.train {yaml}",
    "python -m axolotl.cli.train {yaml}",
    "axolotl train {yaml}",
])
def test_each_command_reads_the_yaml(command: str) -> None:
    """axolotl's three launch commands read the same YAML into the same training."""
    launch = read_launch(LaunchInputs(command=command.format(yaml=YAML), model="llama-3.1-8b", gpu="t4", gpus=1))
    s = launch.setup
    assert (s.method, s.lora_rank, s.seq, s.batch, s.checkpointing) == (Method.QLORA, 32, 4096, 2, True)


def test_defaults(tmp_path: Path) -> None:
    """A YAML with the base model alone: axolotl's defaults, each citing its line."""
    launch = read_launch(LaunchInputs(command=f"axolotl train {_yaml(tmp_path, '')}", model="llama-3.1-8b",
                                      gpu="a100-80gb", gpus=1))
    f = launch.fields
    assert (f["method"].value, f["seq"].value, f["batch"].value, f["accumulation"].value, f["checkpointing"].value,
            f["optimizer"].value) == (Method.FULL, 512, 1, 1, False, Optimizer.ADAMW_FUSED)
    assert "schemas/config.py:665-666" in str(f["seq"].origin)
    assert "schemas/training.py:77-78" in str(f["batch"].origin)
    assert "schemas/peft.py:41-42" in str(f["method"].origin)


@pytest.mark.parametrize("text, field, value", [
    ("rl: dpo\n", "trainer", Trainer.DPO),
    ("rl: orpo\n", "trainer", Trainer.ORPO),
    ("rl: kto\n", "trainer", Trainer.KTO),
    ("rl: grpo\n", "trainer", Trainer.GRPO),
    ("adapter: lora\nlora_r: 16\nlora_alpha: 32\nlora_target_modules: [q_proj, v_proj]\n", "lora_targets",
     ("q_proj", "v_proj")),
    ("fp16: true\n", "precision", Precision.FP16_MIXED),
    ("flash_attention: true\n", "attention", Attention.SDPA),
    ("gradient_checkpointing: offload\n", "checkpointing", True),
    ("fsdp_version: 2\nfsdp_config:\n  offload_params: true\n", "strategy", Strategy.FSDP2_OFFLOAD),
    ("fsdp:\n  - full_shard\n  - auto_wrap\n", "strategy", Strategy.FSDP),  # no fsdp_version: accelerate's FSDP1
])
def test_keys(tmp_path: Path, text: str, field: str, value) -> None:
    """Each axolotl key reaches its field."""
    launch = read_launch(LaunchInputs(command=f"axolotl train {_yaml(tmp_path, text)}", model="llama-3.1-8b",
                                      gpu="a100-80gb", gpus=2))
    assert launch.fields[field].value == value


@pytest.mark.parametrize("text, error, match", [
    ("adapter: lora\n", InvalidValueError, "adapter lora without lora_r"),
    ("adapter: lora\nlora_r: 8\nlora_alpha: 16\n", InvalidValueError, "without lora_target_modules"),
    ("adapter: ia3\n", UnknownNameError, "adapter.*ia3.*known: lora, qlora"),
    ("load_in_4bit: true\n", InvalidValueError, "load_in_4bit without adapter: qlora"),
    ("rl: ebft\n", UnknownNameError, "rl.*ebft"),
    ("optimizer: lion\n", UnknownNameError, "optimizer.*lion"),
])
def test_refused(tmp_path: Path, text: str, error: type, match: str) -> None:
    """What axolotl would refuse, or oomlab does not budget, is refused naming it."""
    with pytest.raises(error, match=match):
        read_launch(LaunchInputs(command=f"axolotl train {_yaml(tmp_path, text)}", model="llama-3.1-8b",
                                 gpu="a100-80gb"))


def test_a_missing_yaml_is_refused() -> None:
    """axolotl train without its YAML is refused saying what is read."""
    with pytest.raises(InvalidValueError, match="axolotl's config YAML is missing"):
        read_launch(LaunchInputs(command="axolotl train --micro_batch_size 2", model="llama-3.1-8b", gpu="t4"))


def test_check_gives_a_verdict_end_to_end() -> None:
    """check on the example: QLoRA of Llama-3-8B at 2 x 4096 tokens does not fit one T4: it fails in the step."""
    r = check(launch_dir=str(FIXTURE), model="llama-3.1-8b", gpu="t4")
    assert r.to_dict()["verdict"] == "does not fit" and r.fails_at is FailsAt.STEP
    assert r.per_gpu_peak_bytes > r.launch.setup.gpu.total_memory_bytes


def test_deepspeed_json_named_by_the_yaml(tmp_path: Path) -> None:
    """deepspeed: zero2.json in the YAML is read (relative to the command's folder): ZeRO-2, micro-batch from the
    YAML filling the JSON's "auto"."""
    (tmp_path / "zero2.json").write_text('{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": '
                                         '"auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}}')
    yaml = _yaml(tmp_path, "deepspeed: zero2.json\nmicro_batch_size: 2\ngradient_accumulation_steps: 4\n")
    launch = read_launch(LaunchInputs(command=f"axolotl train {yaml}", model="llama-3.1-8b", gpu="a100-80gb",
                                      gpus=4, command_dir=str(tmp_path)))
    assert (launch.setup.strategy, launch.setup.batch, launch.fields["accumulation"].value) == (Strategy.ZERO2, 2, 4)


@pytest.mark.parametrize("text, reference", [
    ("rl: grpo\ntrl:\n  beta: 0.04\n", Reference.RESIDENT),
    ("rl: grpo\ntrl:\n  beta: 0.0\n", Reference.NONE),
    ("rl: grpo\n", Reference.DEFAULT),  # TRL's GRPO default beta 0: the budget's default rule
])
def test_grpo_reference_from_trl_beta(tmp_path: Path, text: str, reference: Reference) -> None:
    """axolotl's trl.beta decides whether GRPO keeps a reference model."""
    launch = read_launch(LaunchInputs(command=f"axolotl train {_yaml(tmp_path, text)}", model="llama-3.1-8b",
                                      gpu="a100-80gb", gpus=1))
    assert launch.setup.reference is reference
