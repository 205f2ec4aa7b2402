"""Reading a launch: every field with its origin, unmodelled keys listed, contradictions refused naming both places."""

import json
import re
from pathlib import Path

import pytest

from oomlab.core.choices import Method, Optimizer, Precision, Strategy
from oomlab.core.errors import InvalidValueError, LaunchConflictError, UnknownNameError
from oomlab.launch.origin import OriginKind
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch


def _json(path: Path, data: dict) -> str:
    path.write_text(json.dumps(data, indent=2))
    return str(path)


def test_fp16_here_bf16_there_is_an_error_naming_both(tmp_path: Path) -> None:
    """fp16 in the TrainingArguments, bf16 in the DeepSpeed JSON: a contradiction naming both files and keys."""
    ta = _json(tmp_path / "training_args.json", {"fp16": True, "bf16": False, "per_device_train_batch_size": 1})
    ds = _json(tmp_path / "ds.json", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}})
    with pytest.raises(LaunchConflictError) as err:
        read_launch(LaunchInputs(training_args=ta, deepspeed=ds, model="llama-2-7b", gpu="a100-80gb", gpus=2))
    text = str(err.value)
    assert "contradiction in precision" in text
    assert "training_args.json:2 fp16" in text and "ds.json:3 bf16.enabled" in text


def test_accelerate_mixed_precision_against_a_flag(tmp_path: Path) -> None:
    """accelerate's mixed_precision bf16 against the script's --fp16 is a contradiction; its 'no' gives way."""
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n")
    cmd = f"accelerate launch --config_file {acc} train.py --fp16 --per_device_train_batch_size 1"
    with pytest.raises(LaunchConflictError, match=r"accelerate\.yaml:2 mixed_precision says 'bf16-mixed'"):
        read_launch(LaunchInputs(command=cmd, model="llama-2-7b", gpu="a100-80gb"))
    acc.write_text("distributed_type: MULTI_GPU\nmixed_precision: 'no'\nnum_processes: 2\n")
    launch = read_launch(LaunchInputs(command=cmd, model="llama-2-7b", gpu="a100-80gb"))
    assert launch.setup.precision is Precision.FP16_MIXED and launch.setup.strategy is Strategy.DDP
    assert any("overridden by flag --fp16" in u.why for u in launch.unmodelled)


def test_origins_of_flags_files_and_defaults(tmp_path: Path) -> None:
    """Each field says where it came from: a flag, a file key with its line, a library default, an assumption."""
    cmd = ("torchrun --nproc_per_node 2 train.py --per_device_train_batch_size 2 --gradient_checkpointing "
           "--optim adamw_torch --max_seq_length 1024 --bf16")
    launch = read_launch(LaunchInputs(command=cmd, model="llama-2-7b", gpu="a100-80gb"))
    f = launch.fields
    assert str(f["batch"].origin) == "flag --per_device_train_batch_size 2" and f["batch"].value == 2
    assert str(f["gpus"].origin) == "flag --nproc_per_node 2" and launch.setup.strategy is Strategy.DDP
    assert f["optimizer"].value is Optimizer.ADAMW and f["seq"].value == 1024
    assert f["checkpointing"].value is True and launch.setup.precision is Precision.BF16_MIXED
    assert f["attention"].origin.kind is OriginKind.DEFAULT and "transformers 5.24" in str(f["attention"].origin)
    assert f["nodes"].origin.kind is OriginKind.ASSUMED
    assert launch.hf_trainer


def test_trainer_defaults_when_unsaid() -> None:
    """A Trainer script that says nothing trains fp32, micro-batch 8, adamw_torch_fused: transformers' defaults."""
    launch = read_launch(LaunchInputs(command="python train.py --output_dir out", model="llama-2-7b",
                                      gpu="a100-80gb"))
    s = launch.setup
    assert (s.precision, s.batch, s.optimizer, s.strategy) == (Precision.FP32, 8, Optimizer.ADAMW_FUSED,
                                                              Strategy.SINGLE)
    assert "per_device_train_batch_size=8" in str(launch.fields["batch"].origin)


def test_unknown_keys_are_listed_not_dropped(tmp_path: Path) -> None:
    """Keys and flags oomlab does not model are listed with their place."""
    ds = _json(tmp_path / "ds.json", {"zero_optimization": {"stage": 3, "reduce_scatter": True},
                                      "gradient_clipping": 1.0, "fp16": {"enabled": True}})
    launch = read_launch(LaunchInputs(command="deepspeed train.py --weird_flag 3", deepspeed=ds, model="llama-2-7b",
                                      gpu="t4", gpus=4))
    listed = {str(u.origin) for u in launch.unmodelled}
    assert {"flag --weird_flag", f"{ds}:4 zero_optimization.reduce_scatter", f"{ds}:6 gradient_clipping"} <= listed
    assert launch.setup.strategy is Strategy.ZERO3 and launch.zero3_init


def test_deepspeed_optimizer_block_wins_over_optim(tmp_path: Path) -> None:
    """The JSON's optimizer block decides; the --optim flag is listed as overridden."""
    ds = _json(tmp_path / "ds.json", {"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2},
                                      "fp16": {"enabled": "auto"}})
    launch = read_launch(LaunchInputs(command=f"deepspeed train.py --optim adamw_bnb_8bit --fp16 --deepspeed {ds}",
                                      deepspeed=ds, model="llama-2-7b", gpu="t4", gpus=2))
    assert launch.setup.optimizer is Optimizer.ADAMW and launch.setup.precision is Precision.FP16_MIXED
    assert any(str(u.origin) == "flag --optim adamw_bnb_8bit" and "optimizer block wins" in u.why
               for u in launch.unmodelled)


def test_accelerate_fsdp_config(tmp_path: Path) -> None:
    """accelerate's FSDP config: fsdp_version and offload decide the strategy, with the key's line."""
    acc = tmp_path / "fsdp.yaml"
    acc.write_text("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 2\n"
                   "  fsdp_offload_params: true\n  fsdp_sharding_strategy: FULL_SHARD\n")
    launch = read_launch(LaunchInputs(accelerate_config=str(acc), model="llama-13b", gpu="t4"))
    assert launch.setup.strategy is Strategy.FSDP2_OFFLOAD and launch.setup.gpus == 4
    assert str(launch.fields["strategy"].origin).endswith("fsdp.yaml:4 fsdp_config.fsdp_version")


def test_adapter_and_quantization_make_qlora(tmp_path: Path) -> None:
    """adapter_config.json (r, target_modules) plus load_in_4bit is QLoRA with the adapter's rank."""
    ad = _json(tmp_path / "adapter_config.json", {"peft_type": "LORA", "r": 16, "lora_alpha": 32,
                                                  "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.05})
    q = _json(tmp_path / "quantization_config.json", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})
    launch = read_launch(LaunchInputs(adapter_config=ad, quantization_config=q, model="llama-2-7b", gpu="t4",
                                      gpus=1))
    s = launch.setup
    assert (s.method, s.lora_rank, s.lora_targets) == (Method.QLORA, 16, ("q_proj", "v_proj"))
    assert any(str(u.origin).endswith("lora_dropout") for u in launch.unmodelled)


def test_more_processes_than_gpus_is_a_contradiction() -> None:
    """--nproc_per_node 8 on a machine given as 4 GPUs is refused naming both."""
    with pytest.raises(LaunchConflictError, match="flag --nproc_per_node 8 starts 8 processes per node but flag "
                                                  "--gpus 4 has 4 GPUs"):
        read_launch(LaunchInputs(command="torchrun --nproc_per_node 8 train.py", model="llama-13b", gpu="t4",
                                 gpus=4))


def test_bad_names_list_the_valid_ones() -> None:
    """An unknown --optim or GPU is refused listing what is accepted."""
    with pytest.raises(UnknownNameError, match="unknown optimizer.*'adafactor'; known: adamw_8bit"):
        read_launch(LaunchInputs(command="python t.py --optim adafactor", model="llama-13b", gpu="t4"))
    with pytest.raises(UnknownNameError, match="unknown GPU 'h9000'"):
        read_launch(LaunchInputs(command="python t.py", model="llama-13b", gpu="h9000"))
    with pytest.raises(InvalidValueError, match="no model"):
        read_launch(LaunchInputs(command="python t.py", gpu="t4"))


def test_a_real_training_arguments_dump(tmp_path: Path) -> None:
    """transformers' own TrainingArguments.to_json_string() reads back: its values, every other key listed."""
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, activation_checkpointing=True,
                             report_to=[])
    dump = json.loads(args.to_json_string())
    dump["bf16"] = True  # NB: TrainingArguments refuses bf16 on a machine without a GPU; the dump of a GPU run has it
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(dump, indent=2))
    launch = read_launch(LaunchInputs(training_args=str(path), model="llama-2-7b", gpu="a100-80gb", gpus=2))
    s = launch.setup
    assert (s.batch, s.checkpointing, s.precision, s.optimizer) == (2, True, Precision.BF16_MIXED,
                                                                    Optimizer.ADAMW_FUSED)
    assert launch.fields["strategy"].origin.kind is OriginKind.ASSUMED  # no launcher: a process per GPU assumed
    assert any(str(u.origin).endswith(" learning_rate") for u in launch.unmodelled)


def test_trainer_fsdp_flag_is_fsdp2() -> None:
    """--fsdp 'full_shard auto_wrap' is the Trainer's FSDP, version 2 by transformers' default; offload is offload."""
    launch = read_launch(LaunchInputs(command="torchrun --nproc_per_node 4 train.py --fsdp 'full_shard auto_wrap' "
                                      "--fp16", model="llama-13b", gpu="t4"))
    assert launch.setup.strategy is Strategy.FSDP2
    launch = read_launch(LaunchInputs(command="torchrun --nproc_per_node 4 train.py --fsdp 'full_shard offload' "
                                      "--fp16", model="llama-13b", gpu="t4"))
    assert launch.setup.strategy is Strategy.FSDP2_OFFLOAD
    with pytest.raises(InvalidValueError, match="fsdp 'shard_grad_op' is not budgeted"):
        read_launch(LaunchInputs(command="torchrun --nproc_per_node 4 train.py --fsdp shard_grad_op", model="llama-13b",
                                 gpu="t4"))


@pytest.mark.parametrize("command, where", [
    ("python train.py --deepspeed", "flag --deepspeed"),  # a bare --deepspeed: the script's own JSON, not given
    ("deepspeed train.py", "flag deepspeed (the launcher)"),
])
def test_deepspeed_without_its_json_says_so(command: str, where: str) -> None:
    """A DeepSpeed launch whose JSON is not given is refused, naming the place that made it DeepSpeed."""
    with pytest.raises(InvalidValueError, match="^" + re.escape(f"{where}: a DeepSpeed launch but no DeepSpeed JSON")):
        read_launch(LaunchInputs(command=command, model="llama-13b", gpu="t4", gpus=4))


def test_torchrun_default_is_one_process() -> None:
    """torchrun without --nproc_per_node starts one process (torch's default), whatever the machine has."""
    launch = read_launch(LaunchInputs(command="torchrun train.py", model="llama-13b", gpu="t4", gpus=4))
    assert launch.setup.gpus == 1 and launch.setup.strategy is Strategy.SINGLE
    assert launch.fields["gpus"].origin.kind is OriginKind.DEFAULT


def test_every_choice_field_holds_its_member(tmp_path: Path) -> None:
    """Precision is stated as a Precision member wherever it is read (a script flag, accelerate's mixed_precision,
    a DeepSpeed JSON, a default), as method and optimizer are; output writes the names."""
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("distributed_type: MULTI_GPU\nmixed_precision: fp16\nnum_processes: 2\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    gpu = "a100-80gb"
    for inputs in (LaunchInputs(command="torchrun --nproc_per_node 2 train.py --bf16", model="llama-2-7b", gpu=gpu),
                   LaunchInputs(accelerate_config=str(acc), model="llama-2-7b", gpu=gpu),
                   LaunchInputs(deepspeed=str(ds), model="llama-2-7b", gpu=gpu, gpus=2),
                   LaunchInputs(command="torchrun --nproc_per_node 2 train.py --per_device_train_batch_size 1",
                                model="llama-2-7b", gpu=gpu),
                   LaunchInputs(model="llama-2-7b", gpu=gpu)):
        launch = read_launch(inputs)
        for name, kind in (("strategy", Strategy), ("method", Method), ("precision", Precision),
                           ("optimizer", Optimizer)):
            assert isinstance(launch.fields[name].value, kind), (inputs, name)
        assert launch.fields["precision"].value is launch.setup.precision
        assert launch.to_dict()["fields"]["precision"]["value"] == launch.setup.precision.value


def test_accelerate_mixed_precision_is_one_mapping() -> None:
    """The names accelerate's mixed_precision takes are read back as the precision oomlab writes them for."""
    from oomlab.launch.keys import ACCELERATE_MIXED
    from oomlab.remedies.deepspeed_configs import ACCELERATE_MIXED_PRECISION

    assert ACCELERATE_MIXED == {"fp16": Precision.FP16_MIXED, "bf16": Precision.BF16_MIXED, "no": Precision.FP32}
    assert {p: name for name, p in ACCELERATE_MIXED.items()} == ACCELERATE_MIXED_PRECISION


def test_launch_errors_are_core_errors() -> None:
    """The launch's error classes live with every other error (bad input: exit code 2)."""
    from oomlab.core import errors
    from oomlab.core.errors import LaunchFileError

    assert LaunchConflictError.__module__ == LaunchFileError.__module__ == errors.__name__
    assert issubclass(LaunchConflictError, InvalidValueError) and issubclass(LaunchFileError, InvalidValueError)


@pytest.mark.parametrize("stage", [1, 2])
def test_offload_param_below_stage_3_runs_with_parameters_on_the_gpu(tmp_path: Path, stage: int) -> None:
    """offload_param at stage 1 or 2 is what DeepSpeed runs (it ignores the key): budgeted on the GPU, listed."""
    zero = {"stage": stage, "offload_param": {"device": "cpu", "pin_memory": True}}
    ds = _json(tmp_path / "ds.json", {"bf16": {"enabled": True}, "zero_optimization": zero})
    launch = read_launch(LaunchInputs(command="deepspeed train.py", deepspeed=ds, model="llama-2-7b",
                                      gpu="a100-80gb", gpus=4))
    assert launch.setup.strategy is (Strategy.ZERO1 if stage == 1 else Strategy.ZERO2)
    ignored = [u for u in launch.unmodelled if u.why == "DeepSpeed ignores offload_param below stage 3"]
    assert [(str(u.origin), u.value) for u in ignored] == [(f"{ds}:8 zero_optimization.offload_param.device", "cpu")]


def test_accelerate_offload_param_device_at_stage_2_is_listed_as_ignored(tmp_path: Path) -> None:
    """accelerate's inline offload_param_device at zero_stage 2: ZeRO-2 on the GPU, the key listed as ignored."""
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 2\n"
                   "  offload_param_device: cpu\n")
    launch = read_launch(LaunchInputs(accelerate_config=str(acc), model="llama-2-7b", gpu="a100-80gb"))
    assert launch.setup.strategy is Strategy.ZERO2
    assert [str(u.origin) for u in launch.unmodelled if "ignores offload_param" in u.why] == [
        f"{acc}:5 deepspeed_config.offload_param_device"]
