"""Property: whatever launch files and command a user gives, ``oomlab check`` answers (exit 0) or refuses (exit 2) --
never an exception escaping, never a hang.  Random accelerate YAML, DeepSpeed JSON, TrainingArguments JSON and launch
commands mix the keys oomlab reads with wild values (strings, huge/negative/float/NaN numbers, nested lists, None)."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomlab.cli import main
from tests.cli_support import HANG_S

# a value of any kind a user might write, valid or not
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.integers(min_value=0, max_value=9),  # the small counts most keys take
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["auto", "cpu", "none", "nvme", "fp16", "bf16", "no", "2", "1e308", "nan", "inf", "-1", "", "0,1",
                     "1:4", "full_shard auto_wrap", "adamw_torch", "AdamW", "DEEPSPEED", "FSDP", "MULTI_GPU", "true"]),
    st.text(max_size=12),
)
WILD = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _mapping(choices: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping of some of ``choices``' keys, each with its plausible value or a wild one."""
    return st.fixed_dictionaries({}, optional={key: value | WILD for key, value in choices.items()})


ACCELERATE = _mapping({
    "distributed_type": st.sampled_from(["NO", "MULTI_GPU", "DEEPSPEED", "FSDP"]),
    "num_processes": st.integers(1, 8), "num_machines": st.integers(1, 2),
    "mixed_precision": st.sampled_from(["no", "fp16", "bf16"]),
    "deepspeed_config": _mapping({"zero_stage": st.integers(0, 3), "offload_optimizer_device": st.just("cpu"),
                                  "offload_param_device": st.just("cpu"), "zero3_init_flag": st.booleans(),
                                  "deepspeed_config_file": st.just("ds_config.json")}),
    "fsdp_config": _mapping({"fsdp_version": st.integers(1, 2), "fsdp_offload_params": st.booleans(),
                             "fsdp_sharding_strategy": st.just("FULL_SHARD"),
                             "fsdp_activation_checkpointing": st.booleans()}),
})
DEEPSPEED = _mapping({
    "fp16": _mapping({"enabled": st.sampled_from([True, False, "auto"])}),
    "bf16": _mapping({"enabled": st.sampled_from([True, False, "auto"])}),
    "optimizer": _mapping({"type": st.sampled_from(["AdamW", "Adam"])}),
    "train_micro_batch_size_per_gpu": st.integers(1, 8) | st.just("auto"),
    "data_types": _mapping({"grad_accum_dtype": st.just("fp32")}),
    "zero_optimization": _mapping({
        "stage": st.integers(1, 3), "offload_optimizer": _mapping({"device": st.sampled_from(["cpu", "none"])}),
        "offload_param": _mapping({"device": st.sampled_from(["cpu", "none"])}),
        "reduce_bucket_size": st.integers(0, 10**9) | st.just("auto"), "sub_group_size": st.integers(1, 10**9),
        "stage3_prefetch_bucket_size": st.just("auto"), "overlap_comm": st.booleans()}),
})
TRAINING_ARGS = _mapping({
    "per_device_train_batch_size": st.integers(1, 8), "max_seq_length": st.integers(1, 4096),
    "gradient_checkpointing": st.booleans(), "fp16": st.booleans(), "bf16": st.booleans(),
    "optim": st.sampled_from(["adamw_torch", "adamw_bnb_8bit", "sgd"]), "deepspeed": st.just("ds_config.json"),
    "fsdp": st.just("full_shard auto_wrap"), "fsdp_config": _mapping({"version": st.integers(1, 2)}),
    "attn_implementation": st.sampled_from(["sdpa", "eager", "flash_attention_2"]),
    "torch_dtype": st.sampled_from(["float16", "bfloat16", "auto"]), "use_peft": st.booleans(),
    "lora_r": st.integers(1, 64), "lora_alpha": st.integers(1, 64), "load_in_4bit": st.booleans(),
    "lora_target_modules": st.sampled_from(["q_proj,v_proj", "all-linear"]),
})
LAUNCHER_OPTIONS = {
    "torchrun": ["--nproc_per_node", "--nnodes", "--standalone", "--master_port"],
    "accelerate launch": ["--config_file", "--num_processes", "--num_machines", "--mixed_precision", "--use_deepspeed",
                          "--zero_stage", "--fsdp_version", "--use_fsdp", "--multi_gpu"],
    "deepspeed": ["--num_gpus", "--num_nodes", "--include"],
    "python": [],
}
SCRIPT_FLAGS = ["--per_device_train_batch_size", "--max_seq_length", "--gradient_checkpointing", "--fp16", "--bf16",
                "--deepspeed", "--optim", "--lora_r", "--model_name_or_path", "--output_dir", "--fsdp"]


def _word(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@st.composite
def commands(draw: st.DrawFn) -> str:
    """A launch command: an optional CUDA_VISIBLE_DEVICES, a launcher, its options and the script's flags."""
    launcher = draw(st.sampled_from(sorted(LAUNCHER_OPTIONS)))
    words = []
    if draw(st.booleans()):
        words.append("CUDA_VISIBLE_DEVICES=" + draw(st.sampled_from(["0", "0,1", ",", "", "-1", "GPU-1a2b", "x"])))
    words.append(launcher)
    for option in draw(st.lists(st.sampled_from(LAUNCHER_OPTIONS[launcher] or ["-u"]), max_size=3, unique=True)):
        words += [option, shlex.quote(_word(draw(st.integers(1, 4) | SCALARS)))]
    words.append("train.py")
    for flag in draw(st.lists(st.sampled_from(SCRIPT_FLAGS), max_size=4, unique=True)):
        words += [flag, shlex.quote(_word(draw(st.integers(1, 8) | SCALARS)))]
    return " ".join(words)


def _dump_yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


@pytest.fixture(scope="module")
def warm() -> None:
    """One check before the property runs, so that the first example does not pay the imports against its deadline."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["check", "--gpu", "a100-80gb", "--model", "llama-7b"]) == 0


@pytest.mark.heavy
@settings(max_examples=80, deadline=timedelta(seconds=HANG_S), derandomize=True, database=None,  # a hang guard
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(accelerate=st.none() | ACCELERATE, deepspeed=st.none() | DEEPSPEED, training_args=st.none() | TRAINING_ARGS,
       command=st.none() | commands(), model=st.sampled_from(["llama-7b", "qwen2.5-0.5b"]),
       gpus=st.none() | st.integers(1, 8), gpu=st.sampled_from(["a100-80gb", "t4"]))
def test_check_exits_0_or_2(warm, accelerate, deepspeed, training_args, command, model, gpus, gpu) -> None:
    """Any mix of launch files and command is answered (0) or refused naming the value (2); nothing escapes."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        argv = ["check", "--gpu", gpu, "--model", model, "--launch-dir", str(folder)]
        if gpus is not None:
            argv += ["--gpus", str(gpus)]
        if command is not None:
            (folder / "launch.txt").write_text(command + "\n")
        for data, name, option, dump in ((accelerate, "accelerate.yaml", "--accelerate-config", _dump_yaml),
                                         (deepspeed, "ds_config.json", "--deepspeed", json.dumps),
                                         (training_args, "training_args.json", "--training-args", json.dumps)):
            if data is not None:
                (folder / name).write_text(dump(data))
                argv += [option, str(folder / name)]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own refusal
                code = exc.code
    assert code in (0, 2), f"exit {code}: {err.getvalue()}"
    if code == 2:
        assert "error" in err.getvalue()
