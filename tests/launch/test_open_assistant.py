"""The seed's public twin (LAION-AI/Open-Assistant at b9a6e99, tests/fixtures/open-assistant): its launch as the
README runs it fails at load on 4 x T4, as the seed did; its ZeRO-3 variant loads."""

import json
from pathlib import Path

import pytest
import yaml

from oomlab.core.choices import Optimizer, Precision, Strategy
from oomlab.launch.check import FailsAt, check_launch
from oomlab.launch.display import render_markdown
from oomlab.launch.inputs import check_inputs
from oomlab.launch.origin import OriginKind
from oomlab.launch.paths import LoadPath

TWIN = Path(__file__).parents[1] / "fixtures" / "open-assistant"
COMMIT = "b9a6e99de84ba638cb127628f9f29c5b914e32bb"


@pytest.fixture(scope="module")
def seed_check():
    return check_launch(check_inputs(launch_dir=TWIN / "seed", model="llama-13b", gpu="t4", gpus=4))


def test_readme_cites_the_commit() -> None:
    """The fixture's README names the repository and the commit the files were copied at."""
    text = (TWIN / "README.md").read_text()
    assert "LAION-AI/Open-Assistant" in text and COMMIT in text


@pytest.mark.parametrize("variant", ["seed", "zero3", "ddp"])
def test_training_args_are_the_presets(variant: str) -> None:
    """Each reconstructed TrainingArguments value is config.yaml's `defaults` updated by `llama-13b`, mapped as
    trainer_sft.py maps it."""
    presets = yaml.safe_load((TWIN / "config.yaml").read_text())
    conf = {**presets["defaults"], **presets["llama-13b"]}
    ta = json.loads((TWIN / variant / "training_args.json").read_text())
    for key in ("per_device_train_batch_size", "gradient_checkpointing", "gradient_accumulation_steps",
                "max_length", "num_train_epochs", "warmup_steps", "eval_steps", "save_total_limit"):
        assert ta[key] == conf[key], key
    assert ta["fp16"] is (conf["dtype"] in ("fp16", "float16")) and ta["bf16"] is False
    assert ta["optim"] == ("adamw_bnb_8bit" if conf["quantization"] else "adamw_hf")
    assert ta["torch_dtype"] == "float16"
    expected = {"seed": conf["deepspeed_config"], "zero3": "configs/zero3_config_sft.json", "ddp": None}[variant]
    assert ta["deepspeed"] == expected


def test_the_twins_launch_fails_at_load_as_the_seed(seed_check) -> None:
    """ZeRO-2 from zero_config.json: DeepSpeed's engine moves the fp16 replica with module.to() and dies in
    Module._apply, printing the seed's figures."""
    r = seed_check
    s = r.launch.setup
    assert (s.strategy, s.precision, s.optimizer, s.batch, s.seq, s.checkpointing) == (
        Strategy.ZERO2, Precision.FP16_MIXED, Optimizer.ADAMW, 4, 2048, True)
    assert r.fails_at is FailsAt.LOAD and r.load.path is LoadPath.DEEPSPEED_TO
    assert "14.16 GiB already allocated" in r.load.detail and "Tried to allocate 136.00 MiB" in r.load.detail
    assert r.per_gpu_peak_bytes > s.gpu.total_memory_bytes
    assert r.to_dict()["fails_at"] == "load"


def test_the_ddp_variant_fails_at_load_too() -> None:
    """torchrun without --deepspeed: the Trainer's model.to(device) of the fp16 replica fails the same way."""
    r = check_launch(check_inputs(launch_dir=TWIN / "ddp", model="llama-13b", gpu="t4", gpus=4))
    assert r.launch.setup.strategy is Strategy.DDP and r.load.path is LoadPath.TRAINER_TO
    assert r.fails_at is FailsAt.LOAD


def test_the_zero3_variant_does_not_fail_at_load() -> None:
    """zero3_config_sft.json: from_pretrained partitions under zero.Init; the run gets to the step."""
    r = check_launch(check_inputs(launch_dir=TWIN / "zero3", model="llama-13b", gpu="t4", gpus=4))
    assert r.launch.setup.strategy is Strategy.ZERO3 and r.load.path is LoadPath.ZERO_INIT
    assert r.load.fits and r.fails_at is not FailsAt.LOAD


def test_origins_point_into_the_twins_files(seed_check) -> None:
    """The strategy comes from zero_config.json's stage (line 32), the batch from the TrainingArguments."""
    f = seed_check.launch.fields
    assert str(f["strategy"].origin).endswith("zero_config.json:32 zero_optimization.stage")
    assert str(f["batch"].origin).endswith("training_args.json:12 per_device_train_batch_size")
    assert str(f["optimizer"].origin).endswith("zero_config.json:14 optimizer.type")
    assert f["nodes"].origin.kind is OriginKind.ASSUMED
    assert any(str(u.origin) == "flag --configs" for u in seed_check.launch.unmodelled)


def test_fix_and_markdown(seed_check) -> None:
    """A fix is found that loads and fits; the Markdown reply has the verdict, path, table, fix and assumptions,
    and no HTML."""
    fix = seed_check.smallest_fix
    assert fix is not None and fix.load.fits
    assert fix.per_gpu_peak_bytes <= seed_check.launch.setup.gpu.total_memory_bytes
    md = render_markdown(seed_check)
    for part in ("**Verdict.**", "fails while loading", "**Launch path.**", "| per GPU |", "**Fix.**", "```",
                 "**Assumptions.**"):
        assert part in md, part
    assert "<" not in md.replace("<=", "")
