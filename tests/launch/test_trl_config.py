"""TRL's launch read (oomlab.launch.trl_config): the DPO example of trl/scripts/dpo.py, the trl CLI, --config YAMLs
and packaged accelerate configs, each field with its origin, TRL's defaults cited at 1.16.0, and check's verdict."""

from pathlib import Path

import pytest

from oomlab.core.choices import Method, Precision, Reference, Strategy, Trainer
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.versions import versions_from
from oomlab.launch.check import check
from oomlab.launch.inputs import check_inputs
from oomlab.launch.origin import OriginKind
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch

FIXTURE = Path(__file__).parents[1] / "fixtures" / "trl-dpo"


def _read(command: str, gpu: str = "a10g", **kwargs):
    return read_launch(LaunchInputs(command=command, model="qwen2.5-0.5b", gpu=gpu, **kwargs))


def test_readme_cites_the_source() -> None:
    """The fixture's README names TRL's release and the script the command comes from."""
    text = (FIXTURE / "README.md").read_text()
    assert "TRL 1.16.0" in text and "trl/scripts/dpo.py" in text


def test_the_dpo_example_every_decisive_field() -> None:
    """python trl/scripts/dpo.py ... --use_peft --lora_r 32 --lora_alpha 16: DPO over LoRA, each field from its flag
    or TRL's default with its line."""
    launch = read_launch(check_inputs(launch_dir=FIXTURE, model="qwen2.5-0.5b", gpu="a10g"))
    f, s = launch.fields, launch.setup
    expected = {
        "trainer": (Trainer.DPO, "flag trl/scripts/dpo.py"),
        "method": (Method.LORA, "flag --use_peft"),
        "lora_rank": (32, "flag --lora_r 32"),
        "lora_alpha": (16, "flag --lora_alpha 16"),
        "batch": (2, "flag --per_device_train_batch_size 2"),
        "accumulation": (8, "flag --gradient_accumulation_steps 8"),
        "seq": (1024, "default of TRL 1.16.0 (max_length=1024 (trl/trainer/dpo_config.py:195-196))"),
        "checkpointing": (True, "default of TRL 1.16.0 (gradient_checkpointing=True "
                                "(trl/trainer/base_config.py:62-63))"),
        "precision": (Precision.BF16_MIXED, "default of TRL 1.16.0 (bf16 = not fp16 (trl/trainer/base_config.py:108))"),
        "load_dtype": ("float32", "default of TRL 1.16.0 (ModelConfig dtype='float32' "
                                  "(trl/trainer/model_config.py:89-90))"),
        "strategy": (Strategy.SINGLE, None),
    }
    for name, (value, origin) in expected.items():
        assert f[name].value == value, name
        assert origin is None or str(f[name].origin) == origin, name
    assert f["lora_targets"].value == ("q_proj", "v_proj")  # peft's default for qwen2
    assert (s.trainer, s.reference) == (Trainer.DPO, Reference.DEFAULT)


@pytest.mark.parametrize("command, field, value", [
    ("trl dpo --model_name_or_path x --precompute_ref_log_probs", "reference", Reference.NONE),
    ("trl grpo --model_name_or_path x --beta 0.04", "reference", Reference.RESIDENT),
    ("trl grpo --model_name_or_path x", "trainer", Trainer.GRPO),
    ("trl kto --model_name_or_path x", "trainer", Trainer.KTO),
    ("trl reward --model_name_or_path x", "trainer", Trainer.REWARD),
    ("trl sft --model_name_or_path x --max_seq_length 512", "seq", 512),  # TRL < 0.16's name
    ("trl sft --model_name_or_path x --max_length 2048", "seq", 2048),
    ("trl sft --model_name_or_path x --fp16", "precision", Precision.FP16_MIXED),
    ("trl sft --model_name_or_path x --gradient_checkpointing false", "checkpointing", False),
    ("python -m trl.scripts.dpo --model_name_or_path x", "trainer", Trainer.DPO),
    ("accelerate launch examples/scripts/kto.py --model_name_or_path x", "trainer", Trainer.KTO),
])
def test_flags(command: str, field: str, value) -> None:
    """Each TRL flag and script reaches its field."""
    assert _read(command, gpus=1).fields[field].value == value


def test_config_yaml_under_flags(tmp_path: Path) -> None:
    """--config YAML values are read with their lines; a flag replaces a YAML value and the YAML's is listed."""
    config = tmp_path / "dpo.yaml"
    config.write_text("model_name_or_path: Qwen/Qwen2-0.5B-Instruct\nmax_length: 2048\nper_device_train_batch_size: 4\n"
                      "precompute_ref_log_probs: true\n")
    launch = _read(f"trl dpo --config {config} --per_device_train_batch_size 1", gpus=1)
    f = launch.fields
    assert (f["seq"].value, str(f["seq"].origin)) == (2048, f"{config}:2 max_length")
    assert (f["batch"].value, str(f["batch"].origin)) == (1, "flag --per_device_train_batch_size 1")
    assert (f["reference"].value, str(f["reference"].origin)) == (Reference.NONE,
                                                                  f"{config}:4 precompute_ref_log_probs")
    assert any(u.origin.key == "per_device_train_batch_size" and "overridden" in u.why for u in launch.unmodelled)


def test_packaged_accelerate_config() -> None:
    """--accelerate_config zero3 is TRL's zero3.yaml: DeepSpeed ZeRO-3 under zero.Init, bf16, 8 processes unless
    --num_processes says."""
    launch = _read("trl sft --model_name_or_path x --accelerate_config zero3 --num_processes 4", gpu="a100-80gb",
                   gpus=4)
    s = launch.setup
    assert (s.strategy, s.gpus, s.precision) == (Strategy.ZERO3, 4, Precision.BF16_MIXED)
    assert launch.zero3_init
    assert "trl/accelerate_configs/zero3.yaml" in str(launch.fields["strategy"].origin)


@pytest.mark.parametrize("command, error, match", [
    ("trl sft --model_name_or_path x", InvalidValueError, r"bf16 = not fp16 .*lacks.*--fp16"),  # on a T4
    ("trl sft --model_name_or_path x --fp16 --accelerate_config zero9", UnknownNameError, "accelerate_config.*zero9"),
    ("trl vllm-serve --model x", InvalidValueError, "does not train"),
])
def test_refused(command: str, error: type, match: str) -> None:
    """TRL's bf16 default on a GPU without bf16 stops the launch, as TrainingArguments does; unknown names list the
    known ones."""
    with pytest.raises(error, match=match):
        _read(command, gpu="t4", gpus=1)


def test_check_trainer_given_on_the_command_line() -> None:
    """check --trainer dpo on a plain script: the kind given, with its origin."""
    launch = read_launch(check_inputs(launch="python train.py --per_device_train_batch_size 2 --bf16",
                                      model="qwen2.5-0.5b", gpu="a10g", trainer="dpo"))
    assert launch.setup.trainer is Trainer.DPO
    assert str(launch.fields["trainer"].origin) == "flag --trainer dpo (given on the command line)"


@pytest.mark.heavy
def test_check_gives_a_verdict_end_to_end() -> None:
    """check on the DPO example: Qwen2.5-0.5B DPO over LoRA on one A10G is judged, its trainer named in the JSON."""
    r = check(launch_dir=str(FIXTURE), model="qwen2.5-0.5b", gpu="a10g")
    answer = r.to_dict()
    assert answer["verdict"] in ("fits", "tight", "does not fit")
    assert answer["setup"]["fields"]["trainer"]["value"] == "dpo"
    assert r.launch.setup.trainer is Trainer.DPO


def test_defaults_follow_the_release_given() -> None:
    """--versions trl==0.21.0: no checkpointing default yet (TRL 0.22.0 added it: transformers' False), bf16 = not
    fp16 already (since 0.19.0); trl==0.13.0's DPOConfig had no max_length default (oomlab's assumption then).  The
    transformers of those releases (4.x) loads fp32 without a dtype, so the run stays mixed."""
    command = "trl dpo --model_name_or_path x"
    f = _read(command, gpus=1, versions=versions_from("trl==0.21.0,transformers==4.55.0")).fields
    assert f["checkpointing"].value is False and "transformers" in str(f["checkpointing"].origin)
    assert f["precision"].value is Precision.BF16_MIXED
    assert str(f["precision"].origin) == ("default of TRL 0.21.0 (given) (bf16 = not fp16, the default since TRL "
                                          "0.19.0 (trl/trainer/sft_config.py:252, dpo_config.py:441 at v0.19.0))")
    old = _read(command, gpus=1, versions=versions_from("trl==0.13.0,transformers==4.47.0")).fields
    assert old["seq"].origin.kind is OriginKind.ASSUMED and old["precision"].value is Precision.FP32
    new = _read(command, gpus=1).fields  # TRL not installed here: the release read, 1.16.0
    assert new["checkpointing"].value is True and str(new["checkpointing"].origin).startswith("default of TRL 1.16.0")


def test_a_beta_that_is_no_number_is_refused() -> None:
    """GRPO's --beta nan is refused naming the flag and the value."""
    with pytest.raises(InvalidValueError, match="flag --beta nan: expected a number, got 'nan'"):
        _read("trl grpo --model_name_or_path x --beta nan", gpus=1)


def test_grpo_s_sequence_is_prompt_plus_completion(tmp_path: Path) -> None:
    """GRPO bounds the prompt and the generated completion apart: their sum is the budget's seq, from the flags or the
    YAML; a length key given says it instead; one bound alone leaves the assumption."""
    f = _read("trl grpo --model_name_or_path x --max_prompt_length 512 --max_completion_length 1024", gpus=1).fields
    assert f["seq"].value == 1536 and "--max_prompt_length" in str(f["seq"].origin)
    assert "--max_completion_length" in str(f["seq"].origin)
    config = tmp_path / "grpo.yaml"
    config.write_text("max_prompt_length: 256\nmax_completion_length: 768\n")
    assert _read(f"trl grpo --model_name_or_path x --config {config}", gpus=1).fields["seq"].value == 1024
    assert _read("trl grpo --model_name_or_path x --max_prompt_length 512 --max_completion_length 1024 "
                 "--max_length 2048", gpus=1).fields["seq"].value == 2048
    alone = _read("trl grpo --model_name_or_path x --max_completion_length 1024", gpus=1).fields["seq"]
    assert alone.origin.kind is OriginKind.ASSUMED
    with pytest.raises(InvalidValueError, match="max_prompt_length"):
        _read("trl grpo --model_name_or_path x --max_prompt_length lots --max_completion_length 1024", gpus=1)


def test_modelconfig_loads_float32_from_trl_0_27() -> None:
    """ModelConfig's dtype default became 'float32' in TRL 0.27.0 (the PyPI wheels: None in 0.26.2): a TRL launch
    without a dtype loads the base in fp32 from that release on, at the installed default before it."""
    command = "trl sft --model_name_or_path meta-llama/Llama-2-7b-hf --use_peft --per_device_train_batch_size 1"
    new = _read(command, gpus=1, versions=versions_from("trl==0.27.0,transformers==4.57.1")).fields
    old = _read(command, gpus=1, versions=versions_from("trl==0.26.2,transformers==4.57.1")).fields
    assert new["load_dtype"].value == "float32" and "ModelConfig dtype='float32'" in str(new["load_dtype"].origin)
    assert "load_dtype" not in old or "ModelConfig" not in str(old["load_dtype"].origin)
