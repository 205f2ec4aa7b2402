"""Launch settings that move memory (oomlab.launch.memory_flags): each launcher's loss-kernel flag sets the setup's
``loss`` with its origin; context parallelism, optimizer-in-backward and selective checkpointing are refused by
``python -m oomlab check`` (exit 2) naming the flag; torch.compile is listed with its likely effect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomlab.cli import run_cli
from oomlab.core.choices import Loss
from oomlab.core.errors import UnmodelledSettingError
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch

TRAIN = ("python train.py --model_name_or_path meta-llama/Llama-3.1-8B --per_device_train_batch_size 4 "
         "--max_seq_length 4096 --bf16 --output_dir out")


def _read(command: str, **kw):
    return read_launch(LaunchInputs(command=command, model="llama-3.1-8b", gpu="a100-80gb", gpus=1, **kw))


def _loss(launch) -> tuple[Loss, str]:
    return launch.fields["loss"].value, str(launch.fields["loss"].origin)


def _yaml(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_no_flag_is_transformers_loss_said_so() -> None:
    launch = _read(TRAIN)
    assert launch.setup.loss is Loss.STANDARD
    assert "use_liger_kernel=False" in str(launch.fields["loss"].origin)


def test_script_flag_use_liger_kernel() -> None:
    launch = _read(TRAIN + " --use_liger_kernel True")
    assert launch.setup.loss is Loss.LIGER_FLCE
    assert _loss(launch) == (Loss.LIGER_FLCE, "flag --use_liger_kernel True")
    assert not any("use_liger_kernel" in str(u) for u in launch.unmodelled)


def test_training_args_json(tmp_path: Path) -> None:
    ta = tmp_path / "training_args.json"
    ta.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True, "use_liger_kernel": True}, indent=1))
    launch = read_launch(LaunchInputs(training_args=str(ta), model="llama-3.1-8b", gpu="a100-80gb", gpus=1))
    assert _loss(launch) == (Loss.LIGER_FLCE, f"{ta}:4 use_liger_kernel")
    ta.write_text(json.dumps({"use_liger_kernel": True, "liger_kernel_config": {"fused_linear_cross_entropy": False}},
                             indent=1))
    launch = read_launch(LaunchInputs(training_args=str(ta), model="llama-3.1-8b", gpu="a100-80gb", gpus=1))
    assert launch.setup.loss is Loss.STANDARD and "liger_kernel_config" in str(launch.fields["loss"].origin)


def test_trl_flag() -> None:
    launch = _read("trl sft --model_name_or_path meta-llama/Llama-3.1-8B --use_liger_kernel --max_length 2048")
    assert _loss(launch) == (Loss.LIGER_FLCE, "flag --use_liger_kernel")


def test_llamafactory_enable_liger_kernel_by_stage(tmp_path: Path) -> None:
    base = "model_name_or_path: meta-llama/Llama-3.1-8B\nfinetuning_type: lora\ncutoff_len: 2048\n"
    sft = _yaml(tmp_path, "sft.yaml", base + "stage: sft\nenable_liger_kernel: true\n")
    assert _loss(_read(f"llamafactory-cli train {sft}")) == (Loss.LIGER_FLCE, f"{sft}:5 enable_liger_kernel")
    dpo = _yaml(tmp_path, "dpo.yaml", base + "stage: dpo\nenable_liger_kernel: true\n")
    launch = _read(f"llamafactory-cli train {dpo}")  # require_logits: Liger's plain cross-entropy, logits kept
    assert _loss(launch) == (Loss.STANDARD, f"{dpo}:4 stage")


def test_axolotl_plugins(tmp_path: Path) -> None:
    base = "base_model: NousResearch/Meta-Llama-3-8B\nsequence_len: 2048\n"
    liger = _yaml(tmp_path, "liger.yml", base + "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
                  "liger_fused_linear_cross_entropy: true\n")
    assert _loss(_read(f"axolotl train {liger}")) == (Loss.LIGER_FLCE, f"{liger}:5 liger_fused_linear_cross_entropy")
    cce = _yaml(tmp_path, "cce.yml", base + "plugins:\n  - axolotl.integrations.cut_cross_entropy."
                "CutCrossEntropyPlugin\ncut_cross_entropy: true\n")
    assert _loss(_read(f"axolotl train {cce}")) == (Loss.CCE, f"{cce}:5 cut_cross_entropy")
    bare = _yaml(tmp_path, "bare.yml", base + "cut_cross_entropy: true\n")  # no plugin: axolotl does not apply it
    launch = _read(f"axolotl train {bare}")
    assert launch.setup.loss is Loss.STANDARD
    assert any("cut_cross_entropy" in str(u) and "plugins" in u.why for u in launch.unmodelled)


def test_torch_compile_is_listed_with_its_effect() -> None:
    launch = _read(TRAIN + " --torch_compile True")
    listed = [u for u in launch.unmodelled if "torch_compile" in str(u.origin)]
    assert len(listed) == 1 and "eager" in listed[0].why and "AOTAutograd" in listed[0].why


@pytest.mark.parametrize(("flags", "named"), [
    ("--optim lomo", "optim"),
    ("--optim adalomo", "optim"),
    ("--context_parallel_size 4", "context_parallel_size"),
    ("--ac_mode selective", "ac_mode"),
])
def test_refused_flags_exit_2_naming_the_flag(flags: str, named: str, capsys) -> None:
    code = run_cli(["check", "--launch", f"{TRAIN} {flags}", "--model", "llama-3.1-8b", "--gpu", "a100-80gb",
                    "--gpus", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"flag {flags}: {named} = " in err and "is not budgeted" in err and "oomlab budgets" in err


def test_refused_in_files(tmp_path: Path) -> None:
    ta = tmp_path / "training_args.json"
    ta.write_text(json.dumps({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {
        "use_reentrant": False, "context_fn": "selective"}}))
    with pytest.raises(UnmodelledSettingError, match="gradient_checkpointing_kwargs .* non-default policy"):
        read_launch(LaunchInputs(training_args=str(ta), model="llama-3.1-8b", gpu="a100-80gb", gpus=1))
    ta.write_text(json.dumps({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {
        "use_reentrant": False}}))  # the same tensors saved: read, not refused
    assert read_launch(LaunchInputs(training_args=str(ta), model="llama-3.1-8b", gpu="a100-80gb", gpus=1)).setup
    ax = _yaml(tmp_path, "ax.yml", "base_model: NousResearch/Meta-Llama-3-8B\noptimizer: adalomo\n")
    with pytest.raises(UnmodelledSettingError, match=f"{ax}:2 optimizer: optimizer = 'adalomo'.*AdaLomo"):
        _read(f"axolotl train {ax}")
    ax = _yaml(tmp_path, "cp.yml", "base_model: NousResearch/Meta-Llama-3-8B\nsequence_parallel_degree: 4\n")
    with pytest.raises(UnmodelledSettingError, match="sequence_parallel_degree = 4 .*sequence parallelism"):
        _read(f"axolotl train {ax}")
    acc = _yaml(tmp_path, "acc.yaml", "distributed_type: FSDP\nnum_processes: 8\nparallelism_config:\n"
                "  parallelism_config_cp_size: 2\n")
    code = run_cli(["check", "--launch", f"accelerate launch --config_file {acc} train.py", "--model",
                    "llama-3.1-8b", "--gpu", "a100-80gb"])
    assert code == 2


def test_check_loss_decides_whatever_the_launch_says() -> None:
    from oomlab.launch.check import check

    r = check(launch=TRAIN + " --use_liger_kernel True", model="llama-3.1-8b", gpu="a100-80gb", gpus=1, loss="cce")
    assert r.launch.setup.loss is Loss.CCE
    assert str(r.launch.fields["loss"].origin) == "flag --loss cce (given on the command line)"
    assert any("--use_liger_kernel True" in str(u.origin) for u in r.launch.unmodelled)  # listed as overridden


def test_the_ladder_offers_liger_and_the_fix_command_carries_it() -> None:
    """Llama-3.1-8B LoRA at 12 x 4096 with checkpointing on one A100-80GB: the (tokens x vocab) logits (128k words)
    are what does not fit; Liger's fused loss alone fits, a free rung before anything that costs speed."""
    from oomlab.launch.check import check
    from oomlab.remedies.ladder import KIND, Kind, Rung

    command = ("trl sft --model_name_or_path meta-llama/Llama-3.1-8B --use_peft --per_device_train_batch_size 12 "
               "--max_length 4096 --bf16 --gradient_checkpointing --output_dir out")
    r = check(launch=command, model="llama-3.1-8b", gpu="a100-80gb", gpus=1)
    assert r.decision.verdict.word == "does not fit"
    assert [s.rung for s in r.decision.steps] == [Rung.FUSED_LOSS] and KIND[Rung.FUSED_LOSS] is Kind.FREE
    fix = r.smallest_fix
    assert fix.changes == (("loss", "liger-flce"),)
    assert fix.launch == command + " --use_liger_kernel True"
    assert "--use_liger_kernel True (pip install liger-kernel)" in fix.how[0]
    assert r.to_dict()["decision"]["steps"][0]["loss"] == "liger-flce"


def test_activation_offloading_flags(tmp_path: Path) -> None:
    launch = _read("trl sft --model_name_or_path meta-llama/Llama-3.1-8B --activation_offloading --max_length 2048")
    assert launch.setup.offload_activations
    assert str(launch.fields["offload_activations"].origin) == "flag --activation_offloading"
    assert not _read(TRAIN).setup.offload_activations
    assert "no activation_offloading" in str(_read(TRAIN).fields["offload_activations"].origin)
    ax = _yaml(tmp_path, "off.yml", "base_model: NousResearch/Meta-Llama-3-8B\nactivation_offloading: true\n")
    launch = _read(f"axolotl train {ax}")
    assert (launch.setup.offload_activations, str(launch.fields["offload_activations"].origin)) == \
        (True, f"{ax}:2 activation_offloading")
    ax = _yaml(tmp_path, "gc.yml", "base_model: NousResearch/Meta-Llama-3-8B\ngradient_checkpointing: offload\n")
    launch = _read(f"axolotl train {ax}")
    assert launch.setup.offload_activations and launch.setup.checkpointing


def test_pipeline_parameters_reach_the_setup() -> None:
    """``python -m oomlab run -p loss=liger-flce -p offload_activations=true``: the notebooks' setup carries both."""
    from oomlab.launch.user import user_launch
    from oomlab.pipeline.params import PARAMETERS, parse_params

    launch = user_launch(parse_params(["model=llama-2-7b", "gpu=a100-80gb", "gpus=1", "loss=liger-flce",
                                       "offload_activations=true"]),
                         {name: p.default for name, p in PARAMETERS.items()})
    assert launch.setup.loss is Loss.LIGER_FLCE and launch.setup.offload_activations
    assert str(launch.fields["loss"].origin) == "flag -p loss=liger-flce"
