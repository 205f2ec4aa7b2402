"""Launch files: accelerate's and DeepSpeed's own loaders accept them; train.py trains 2 steps on CPU under every
accelerate config, through accelerate's own prepare path."""

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from oomlab.core.choices import Method, Optimizer, Precision, Route, Strategy
from oomlab.core.paths import TEMPLATES_DIR
from oomlab.remedies import cpu_launch, launch_dir, launch_files
from oomlab.remedies.plan import make_plan

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
        "tie_word_embeddings": False}
FSDP1_CONFIGS = (launch_files.FSDP, launch_files.FSDP_OFFLOAD)
FSDP2_CONFIGS = (launch_files.FSDP2, launch_files.FSDP2_OFFLOAD)
OFFLOAD_CONFIGS = (launch_files.FSDP_OFFLOAD, launch_files.FSDP2_OFFLOAD)


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


def test_every_launchable_strategy_has_its_config() -> None:
    """Each strategy but single and ZeRO-1/2 maps to its own accelerate config file, and launch_dir launches them."""
    assert launch_files.ACCELERATE_CONFIG == {
        Strategy.FSDP: "accelerate_fsdp.yaml", Strategy.FSDP_OFFLOAD: "accelerate_fsdp_offload.yaml",
        Strategy.FSDP2: "accelerate_fsdp2.yaml", Strategy.FSDP2_OFFLOAD: "accelerate_fsdp2_offload.yaml",
        Strategy.DDP: "accelerate_ddp.yaml"}
    assert set(launch_dir.LAUNCHABLE) == {*launch_files.ACCELERATE_CONFIG, Strategy.SINGLE}


DS_ALTERNATIVE = ("deepspeed_zero3_offload.json", "accelerate_deepspeed_zero3_offload.yaml")


@pytest.mark.parametrize(("route", "strategy", "files"), [
    (Route.PROCESS_PER_GPU, Strategy.FSDP, ("accelerate_fsdp.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, Strategy.FSDP_OFFLOAD, ("accelerate_fsdp_offload.yaml", *DS_ALTERNATIVE, "train.py",
                                                    "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, Strategy.FSDP2, ("accelerate_fsdp2.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, Strategy.FSDP2_OFFLOAD, ("accelerate_fsdp2_offload.yaml", *DS_ALTERNATIVE, "train.py",
                                                     "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, Strategy.DDP, ("accelerate_ddp.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, Strategy.SINGLE, ("train.py", "LAUNCH.md")),  # --num_processes 1, no config
    (Route.PROCESS_PER_GPU, Strategy.ZERO2, ()),  # no DeepSpeed ZeRO-1/2 config yet
    (Route.DEVICE_MAP, Strategy.SINGLE, ()),  # one process over every GPU: nothing written
])
def test_files_for(route: Route, strategy: Strategy, files: tuple[str, ...]) -> None:
    """The files that launch a remedy: its strategy's config (plus the DeepSpeed alternative when it offloads)."""
    assert launch_files.files_for(route, strategy) == files


@pytest.mark.parametrize(("name", "version", "offload"), [
    (launch_files.FSDP, 1, False), (launch_files.FSDP_OFFLOAD, 1, True),
    (launch_files.FSDP2, 2, False), (launch_files.FSDP2_OFFLOAD, 2, True)])
def test_accelerate_loads_fsdp_config(written, name: str, version: int, offload: bool) -> None:
    """accelerate's own loader reads each FSDP config: its version, fp16, LlamaDecoderLayer wrap, offload as chosen."""
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(written[name]))
    assert cfg.distributed_type == "FSDP" and cfg.mixed_precision == "fp16" and cfg.num_processes == 4
    fsdp = cfg.fsdp_config
    assert fsdp["fsdp_version"] == version and fsdp["fsdp_offload_params"] is offload
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert fsdp["fsdp_cpu_ram_efficient_loading"] is True
    if version == 1:  # what `accelerate config` writes for FSDP1 with its defaults
        assert {k: fsdp[k] for k in ("fsdp_reshard_after_forward", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
                                     "fsdp_use_orig_params", "fsdp_sync_module_states", "fsdp_state_dict_type")} == {
            "fsdp_reshard_after_forward": "FULL_SHARD", "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_forward_prefetch": False, "fsdp_use_orig_params": True, "fsdp_sync_module_states": True,
            "fsdp_state_dict_type": "FULL_STATE_DICT"}
    else:
        assert fsdp["fsdp_reshard_after_forward"] is True and fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
        assert "fsdp_backward_prefetch" not in fsdp and "fsdp_use_orig_params" not in fsdp  # FSDP1-only keys


def test_accelerate_loads_ddp_config(written) -> None:
    """The DDP config is accelerate's MULTI_GPU over every GPU."""
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(written[launch_files.DDP]))
    assert cfg.distributed_type == "MULTI_GPU" and cfg.mixed_precision == "fp16" and cfg.gpu_ids == "all"


@pytest.mark.parametrize(("name", "expected"), [
    (launch_files.FSDP, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "FSDP_OFFLOAD_PARAMS": "false",
                         "FSDP_RESHARD_AFTER_FORWARD": "full_shard", "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE",
                         "FSDP_USE_ORIG_PARAMS": "true", "FSDP_SYNC_MODULE_STATES": "true",
                         "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}),
    (launch_files.FSDP_OFFLOAD, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "FSDP_OFFLOAD_PARAMS": "true"}),
    (launch_files.FSDP2, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "false",
                          "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}),
    (launch_files.FSDP2_OFFLOAD, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"}),
    (launch_files.DDP, {"ACCELERATE_MIXED_PRECISION": "fp16"}),
])
def test_accelerate_launch_env_from_config(written, name: str, expected: dict[str, str]) -> None:
    """accelerate launch (its own _validate_launch_command + prepare_multi_gpu_env) turns each config into the
    environment the processes read."""
    env = cpu_launch.launch_env(written[name], 4)
    assert {k: env.get(k) for k in expected} == expected
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"
    if name != launch_files.DDP:
        assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
    else:
        assert "ACCELERATE_USE_FSDP" not in env


def test_deepspeed_accepts_zero3_offload(written, monkeypatch) -> None:
    """DeepSpeed's DeepSpeedConfig (as 4 ranks see it) reads ZeRO-3 with parameter and optimizer offload, fp16."""
    from deepspeed.runtime import config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 4)
    cfg = ds_config.DeepSpeedConfig(json.loads(written[launch_files.DS_JSON].read_text()))
    assert cfg.zero_optimization_stage == 3 and cfg.float16_config.enabled and cfg.world_size == 4
    assert cfg.zero_config.offload_param.device == "cpu" and cfg.zero_config.offload_optimizer.device == "cpu"
    assert cfg.train_batch_size == 4 * cfg.train_micro_batch_size_per_gpu
    assert cfg.zero_force_ds_cpu_optimizer is False  # train.py passes its own torch optimizer


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


def test_launch_doc_follows_its_settings() -> None:
    """LAUNCH.md names the model, layer, processes and length it is written for, and nothing of the seed's."""
    settings = launch_files.LaunchSettings(num_processes=8, mixed_precision="bf16",
                                           decoder_layer="MistralDecoderLayer")
    doc = launch_files.launch_doc([], settings, model_id="mistralai/Mistral-7B-v0.1", seq=4096)
    assert "8 processes per machine" in doc and "mixed precision bf16" in doc and "`MistralDecoderLayer`" in doc
    assert ("accelerate launch --config_file accelerate_deepspeed_zero3_offload.yaml train.py --model "
            "mistralai/Mistral-7B-v0.1 --method lora --checkpointing --seq 4096 --batch 1") in doc
    assert "llama" not in doc.lower() and "13b" not in doc
    assert all(f"`{name}` | `{strategy.value}`" in doc for strategy, name in launch_files.ACCELERATE_CONFIG.items())


@pytest.mark.parametrize(("strategy", "optimizer", "precision", "head"), [
    (Strategy.FSDP, Optimizer.ADAMW, Precision.FP16_MIXED,
     "accelerate launch --config_file accelerate_fsdp.yaml --num_processes 4 --mixed_precision fp16 train.py"),
    (Strategy.FSDP2, Optimizer.ADAMW_FUSED, Precision.BF16_MIXED,
     "accelerate launch --config_file accelerate_fsdp2.yaml --num_processes 4 --mixed_precision bf16 train.py"),
    (Strategy.FSDP2_OFFLOAD, Optimizer.ADAMW_8BIT, Precision.FP32,
     "accelerate launch --config_file accelerate_fsdp2_offload.yaml --num_processes 4 --mixed_precision no "
     "train.py"),
    (Strategy.SINGLE, Optimizer.SGD, Precision.FP16_MIXED,
     "accelerate launch --num_processes 1 --mixed_precision fp16 train.py"),
])
def test_launch_command_uses_the_strategy_config(plan, strategy, optimizer, precision, head) -> None:
    """The command launches the strategy's config with the remedy's precision and passes its optimizer."""
    remedy = replace(plan.recommended, strategy=strategy, optimizer=optimizer, precision=precision,
                     method=Method.LORA, checkpointing=True, max_batch=2)
    command = launch_dir.launch_command(remedy, "org/model", 1024, 16, 4)
    assert command == (f"{head} --model org/model --method lora --seq 1024 --batch 2 --optimizer {optimizer.value} "
                       "--lora-rank 16 --checkpointing")


@pytest.mark.parametrize(("route", "strategy", "precision"), [
    (Route.DEVICE_MAP, Strategy.SINGLE, Precision.FP16_MIXED),  # one process spread over the GPUs
    (Route.PROCESS_PER_GPU, Strategy.ZERO1, Precision.FP16_MIXED),  # no DeepSpeed ZeRO-1 config
    (Route.PROCESS_PER_GPU, Strategy.FSDP, Precision.BF16),  # pure bf16: train.py keeps fp32 trainable weights
])
def test_launch_command_none_without_a_launch(plan, route, strategy, precision) -> None:
    """No command where no launch file runs the remedy."""
    remedy = replace(plan.recommended, route=route, strategy=strategy, precision=precision)
    assert launch_dir.launch_command(remedy, "org/model", 1024) is None


def test_train_script_accepts_every_optimizer() -> None:
    """train.py's --optimizer takes each of oomlab's optimizer choices (and only those)."""
    spec = importlib.util.spec_from_file_location("oomlab_train_template", TEMPLATES_DIR / "launch" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    assert [train.parse_args(["--optimizer", o.value]).optimizer for o in Optimizer] == [o.value for o in Optimizer]
    with pytest.raises(SystemExit):
        train.parse_args(["--optimizer", "lion"])


FSDP1_PATCHES = ("fsdp-distributed-type", "cpu-device-without-index", "fsdp1-sync-module-states")
FP16 = ("fp16-native-amp",)
FSDP1_FLAT = [["float32", True]]  # full fine-tuning: every unit trainable, fp32 (accelerate's upcast)
LORA_FLAT = [["float16", False], ["float32", True]]  # peft's wrap policy: frozen half base apart from fp32 adapters

# One run per emitted accelerate config (fp16, as written for the seed's T4: CPU fp16 kernels run all of them),
# each through accelerate's own prepare with the CPU patches it needs; the model wrapper, the autocast evidence and
# the first decoder layer's compute dtype are what accelerate builds on GPUs for that config.
CPU_RUNS = [
    pytest.param(launch_files.FSDP, "full", [], FSDP1_PATCHES + FP16,
                 {"distributed_type": "FSDP", "fsdp_version": 1, "model_class": "FullyShardedDataParallel",
                  "accelerate_autocast": True, "forward": {"autocast": "float16", "weight_dtype": "float16"},
                  "fsdp1_flat_params": FSDP1_FLAT, "scaler": "ShardedGradScaler", "loss_dtype": "float32"},
                 id="fsdp-full"),
    pytest.param(launch_files.FSDP, "lora", ["--optimizer", "adamw-fused"], FSDP1_PATCHES + FP16,
                 {"distributed_type": "FSDP", "fsdp_version": 1, "model_class": "FullyShardedDataParallel",
                  "accelerate_autocast": True, "forward": {"autocast": "float16", "weight_dtype": "float16"},
                  "fsdp1_flat_params": LORA_FLAT, "optimizer_fused": True}, id="fsdp-lora-fused"),
    pytest.param(launch_files.FSDP_OFFLOAD, "lora", [],
                 FSDP1_PATCHES + ("fsdp1-offload-unpinned", "cpu-stream-synchronize") + FP16,
                 {"distributed_type": "FSDP", "fsdp_version": 1, "model_class": "FullyShardedDataParallel",
                  "accelerate_autocast": True, "forward": {"autocast": "float16", "weight_dtype": "float16"},
                  "fsdp1_flat_params": LORA_FLAT}, id="fsdp-offload-lora"),
    pytest.param(launch_files.FSDP2, "full", ["--checkpointing"], ("fsdp-distributed-type",) + FP16,
                 {"distributed_type": "FSDP", "fsdp_version": 2, "fsdp2_module": True, "accelerate_autocast": False,
                  "forward": {"autocast": None, "weight_dtype": "float16"}, "scaler": "GradScaler",
                  "loss_dtype": "float16"}, id="fsdp2-full-checkpointing"),
    pytest.param(launch_files.FSDP2_OFFLOAD, "lora", ["--optimizer", "sgd"],
                 ("fsdp-distributed-type", "fsdp2-offload-unpinned") + FP16,
                 {"distributed_type": "FSDP", "fsdp_version": 2, "fsdp2_module": True, "accelerate_autocast": False,
                  "forward": {"autocast": None, "weight_dtype": "float16"}, "optimizer": "SGD"},
                 id="fsdp2-offload-lora-sgd"),
    # bitsandbytes NF4 on CPU; accelerate's CPU DDP branch (MULTI_CPU, prepare_model's DistributedDataParallel)
    pytest.param(launch_files.DDP, "qlora", ["--checkpointing"], FP16,
                 {"distributed_type": "MULTI_CPU", "model_class": "DistributedDataParallel",
                  "accelerate_autocast": True, "forward": {"autocast": "float16", "weight_dtype": "float16"}},
                 id="ddp-qlora"),
]


@pytest.mark.parametrize(("config", "method", "extra", "patches", "prepared"), CPU_RUNS)
def test_script_trains_two_steps_on_cpu(written, tmp_path, config: str, method: str, extra: list[str],
                                        patches: tuple[str, ...], prepared: dict) -> None:
    """train.py runs 2 steps on 2 gloo processes through accelerate's own prepare for the config; losses finite."""
    folder = next(iter(written.values())).parent
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    log = tmp_path / "log.jsonl"
    results = cpu_launch.run_on_cpu(folder, config, ["--tiny-config", str(tmp_path / "tiny.json"), "--method", method,
                                                  "--seq", "32", "--batch", "2", "--steps", "2",
                                                  "--log-json", str(log), *extra])
    for r in results:
        assert r.exit_code == 0, r.output[-3000:]
    assert [r.patches for r in results] == [patches, patches]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    built = records[0]["prepared"]
    assert {k: built.get(k) for k in prepared} == prepared
    assert built["optimizer_holds_model_params"] is True
    steps = records[1:]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(0 < r["loss"] < float("inf") for r in steps)


def test_cpu_patches_are_named_with_a_reason() -> None:
    """Every CPU patch has a unique name and a reason that cites the source it works around."""
    assert len(cpu_launch.CPU_PATCHES) == len({p.name for p in cpu_launch.CPU_PATCHES.values()})
    assert all(".py:" in p.reason for p in cpu_launch.CPU_PATCHES.values())
    used = {name for param in CPU_RUNS for name in param.values[3]}
    assert used == set(cpu_launch.CPU_PATCHES)  # each one is needed by some config's run


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
    assert [r.exit_code for r in results] == codes
    assert [r.patches for r in results] == [None, None]  # the script built no Accelerator
    assert log.read_text() == "step\n"  # the retried run's log only
    assert marker.read_text() == marker_text


def test_run_on_cpu_rejects_zero_attempts(written) -> None:
    with pytest.raises(ValueError, match="attempts=0"):
        cpu_launch.run_on_cpu(next(iter(written.values())).parent, launch_files.DDP, [], attempts=0)
