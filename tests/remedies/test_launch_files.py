"""Launch files: accelerate's and DeepSpeed's own loaders accept them; the script trains 2 steps on CPU."""

import json
from pathlib import Path

import pytest

from oomlab.remedies import cpu_launch, launch_dir, launch_files
from oomlab.remedies.plan import make_plan

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
        "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def plan():
    return make_plan()


@pytest.fixture(scope="module")
def written(tmp_path_factory, plan) -> dict[str, Path]:
    return launch_dir.write_configs(tmp_path_factory.mktemp("configs"), plan)


def test_writes_every_file_atomically(written) -> None:
    """Every launch file is there and no temporary file is left behind."""
    folder = next(iter(written.values())).parent
    assert sorted(p.name for p in folder.iterdir()) == sorted(launch_files.ALL_FILES)


@pytest.mark.parametrize(("name", "offload"), [(launch_files.FSDP, False), (launch_files.FSDP_OFFLOAD, True)])
def test_accelerate_loads_fsdp_config(written, name: str, offload: bool) -> None:
    """accelerate's own loader reads the FSDP configs: full shard, fp16, LlamaDecoderLayer wrap, offload as chosen."""
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(written[name]))
    assert str(cfg.distributed_type) == "DistributedType.FSDP" or cfg.distributed_type == "FSDP"
    assert cfg.mixed_precision == "fp16" and cfg.num_processes == 4
    assert cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert cfg.fsdp_config["fsdp_reshard_after_forward"] is True
    assert cfg.fsdp_config["fsdp_offload_params"] is offload


def test_accelerate_launch_env_from_config(written) -> None:
    """accelerate launch turns the offload config into the FSDP environment the processes read."""
    env = cpu_launch.launch_env(written[launch_files.FSDP_OFFLOAD], 4)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_OFFLOAD_PARAMS"] == "true" and env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"


def test_deepspeed_accepts_zero3_offload(written, monkeypatch) -> None:
    """DeepSpeed's DeepSpeedConfig (as 4 ranks see it) reads ZeRO-3 with parameter and optimizer offload, fp16."""
    from deepspeed.runtime import config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 4)
    cfg = ds_config.DeepSpeedConfig(json.loads(written[launch_files.DS_JSON].read_text()))
    assert cfg.zero_optimization_stage == 3 and cfg.float16_config.enabled and cfg.world_size == 4
    assert cfg.zero_config.offload_param.device == "cpu" and cfg.zero_config.offload_optimizer.device == "cpu"
    assert cfg.train_batch_size == 4 * cfg.train_micro_batch_size_per_gpu


def test_accelerate_loads_deepspeed_config(written) -> None:
    """The accelerate config of the DeepSpeed route points at the JSON."""
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(written[launch_files.DS_ACCELERATE]))
    assert cfg.deepspeed_config["deepspeed_config_file"] == launch_files.DS_JSON


def test_launch_doc_has_recommended_command(written, plan) -> None:
    """LAUNCH.md carries the exact command of the recommended remedy."""
    rec = plan.recommended
    command = launch_dir.launch_command(rec, "huggyllama/llama-13b", plan.seq, plan.lora_rank, plan.gpus)
    assert command in written[launch_files.LAUNCH_DOC].read_text()
    assert command.startswith("accelerate launch --config_file ")


@pytest.mark.parametrize(("config", "method"), [
    (launch_files.FSDP_OFFLOAD, "lora"),  # FSDP2 full shard + CPU offload, fp16 MixedPrecisionPolicy
    (launch_files.DDP, "qlora"),  # bitsandbytes NF4 on CPU, DDP over gloo
])
def test_script_trains_two_steps_on_cpu(written, tmp_path, config: str, method: str) -> None:
    """train.py runs 2 steps with 2 gloo processes under the config's own launch environment; losses finite."""
    folder = next(iter(written.values())).parent
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    log = tmp_path / "log.jsonl"
    results = cpu_launch.run_on_cpu(folder, config, ["--tiny-config", str(tmp_path / "tiny.json"), "--method", method,
                                                  "--seq", "32", "--batch", "2", "--steps", "2", "--checkpointing",
                                                  "--log-json", str(log)])
    for code, out in results:
        assert code == 0, out[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["loss"] > 0 for r in records)
    if config != launch_files.DDP:
        assert all(r.get("fsdp_on_cpu") for r in records)


FLAKY_SCRIPT = """\
import os, sys
from pathlib import Path
log = Path(sys.argv[sys.argv.index("--log-json") + 1])
marker = Path(sys.argv[sys.argv.index("--marker") + 1])
if os.environ["RANK"] == "0":
    with log.open("a") as f:
        f.write("step\\n")
if os.environ["RANK"] == "1" and sys.argv[sys.argv.index("--fail") + 1] == "abort" and not marker.exists():
    marker.write_text("aborted once")
    os.abort()  # as gloo's threads did at interpreter exit
if sys.argv[sys.argv.index("--fail") + 1] == "exit" and os.environ["RANK"] == "1":
    marker.write_text(marker.read_text() + "x" if marker.exists() else "x")
    sys.exit(3)
"""


@pytest.mark.parametrize(("fail", "codes", "marker_text"), [("abort", [0, 0], "aborted once"), ("exit", [0, 3], "x")])
def test_run_on_cpu_retries_only_a_rank_killed_by_a_signal(written, tmp_path, fail, codes, marker_text) -> None:
    """A rank killed by SIGABRT is run again from an empty log; an ordinary failure is returned at once."""
    folder = tmp_path / "launch"
    folder.mkdir()
    (folder / launch_files.DDP).write_text(written[launch_files.DDP].read_text())
    (folder / launch_files.TRAIN_SCRIPT).write_text(FLAKY_SCRIPT)
    log, marker = tmp_path / "log.txt", tmp_path / "marker"
    results = cpu_launch.run_on_cpu(folder, launch_files.DDP, ["--log-json", str(log), "--marker", str(marker),
                                                       "--fail", fail], timeout=60)
    assert [code for code, _ in results] == codes
    assert log.read_text() == "step\n"  # the retried run's log only
    assert marker.read_text() == marker_text


def test_run_on_cpu_rejects_zero_attempts(written) -> None:
    with pytest.raises(ValueError, match="attempts=0"):
        cpu_launch.run_on_cpu(next(iter(written.values())).parent, launch_files.DDP, [], attempts=0)
