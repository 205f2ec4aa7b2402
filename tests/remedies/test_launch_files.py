"""Launch files: accelerate's and DeepSpeed's own loaders accept them; train.py trains 2 steps on CPU under every
accelerate config, through accelerate's own prepare path."""

import importlib.util
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from oomlab.budget.step import tiny_setup
from oomlab.core.choices import Method, Optimizer, Precision, Route, Strategy
from oomlab.core.models import load_model
from oomlab.core.paths import TEMPLATES_DIR
from oomlab.core.setup import make_setup
from oomlab.evidence import cpu_launch
from oomlab.remedies import deepspeed_configs, launch_files, launch_writer
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
    return launch_writer.write_configs(tmp_path_factory.mktemp("configs"), plan)


def test_writes_every_file_atomically(written) -> None:
    """Every launch file is there (the fixed ones, and each top DeepSpeed remedy's JSON and accelerate config) and no
    temporary file is left behind."""
    folder = next(iter(written.values())).parent
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(written) and set(launch_files.ALL_FILES) <= set(names)
    deepspeed = [n for n in names if n not in launch_files.ALL_FILES]
    assert all(re.fullmatch(r"(accelerate_)?deepspeed_zero[123](_offload)?_(fp16|bf16|fp32)_[a-z0-9_]+_b\d+\."
                            r"(json|yaml)", n) for n in deepspeed)


def test_every_launchable_strategy_has_its_config() -> None:
    """Each FSDP/DDP strategy maps to its own accelerate config file; launch_dir launches them, one GPU and every ZeRO
    stage (a JSON and config per remedy)."""
    assert launch_files.ACCELERATE_CONFIG == {
        Strategy.FSDP: "accelerate_fsdp.yaml", Strategy.FSDP_OFFLOAD: "accelerate_fsdp_offload.yaml",
        Strategy.FSDP2: "accelerate_fsdp2.yaml", Strategy.FSDP2_OFFLOAD: "accelerate_fsdp2_offload.yaml",
        Strategy.DDP: "accelerate_ddp.yaml"}
    zero = {Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD}
    assert set(launch_writer.LAUNCHABLE) == {*launch_files.ACCELERATE_CONFIG, Strategy.SINGLE, *zero}


def _setup(strategy: str, **kw):
    kw = {"model": "llama-13b", "gpu": "t4", "gpus": 4, "method": "lora", "precision": "fp16-mixed",
          "optimizer": "adamw", **kw}
    return make_setup(strategy=strategy, **kw)


@pytest.mark.parametrize(("route", "strategy", "kw", "max_batch", "files"), [
    (Route.PROCESS_PER_GPU, "fsdp", {}, 4, ("accelerate_fsdp.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, "fsdp-offload", {}, 4, ("accelerate_fsdp_offload.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, "fsdp2", {}, None, ("accelerate_fsdp2.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, "fsdp2-offload", {}, 1, ("accelerate_fsdp2_offload.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, "ddp", {}, 1, ("accelerate_ddp.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, "single", {"gpus": 1}, 1, ("train.py", "LAUNCH.md")),  # --num_processes 1, no config
    # a ZeRO remedy: its own JSON and accelerate config, named for what differs in them; the micro-batch is the
    # largest that fits, capped at 8 (the commands' --batch)
    (Route.PROCESS_PER_GPU, "zero2", {}, 4, ("deepspeed_zero2_fp16_adamw_b4.json",
                                             "accelerate_deepspeed_zero2_fp16_adamw_b4.yaml", "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, "zero3-offload", {"precision": "bf16-mixed", "gpu": "a100-80gb",
                                              "optimizer": "adamw-fused"}, 300,
     ("deepspeed_zero3_offload_bf16_adamw_fused_b8.json", "accelerate_deepspeed_zero3_offload_bf16_adamw_fused_b8.yaml",
      "train.py", "LAUNCH.md")),
    (Route.PROCESS_PER_GPU, "zero1", {"precision": "fp32"}, None, ("deepspeed_zero1_fp32_adamw_b1.json",
                                                                   "accelerate_deepspeed_zero1_fp32_adamw_b1.yaml",
                                                                   "train.py", "LAUNCH.md")),
    (Route.DEVICE_MAP, "single", {}, 1, ()),  # one process over every GPU: nothing written
])
def test_files_for(route: Route, strategy: str, kw: dict, max_batch: int | None, files: tuple[str, ...]) -> None:
    """The files that launch a remedy: its strategy's config, or a ZeRO remedy's JSON and accelerate config."""
    assert launch_files.files_for(route, _setup(strategy, **kw), max_batch) == files


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


def _ds_config(config: dict, world: int, monkeypatch):
    """DeepSpeed's own DeepSpeedConfig of ``config`` as ``world`` ranks see it."""
    from deepspeed.runtime import config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: world)
    return ds_config.DeepSpeedConfig(config)


def test_plan_writes_its_top_deepspeed_remedies(tmp_path) -> None:
    """Each top DeepSpeed remedy of the plan gets its JSON and accelerate config, named in its config_files (a
    DeepSpeed user's plan: its fix stays on the user's launcher, as the ladder keeps it)."""
    plan = make_plan(strategy="zero2")
    written = launch_writer.write_configs(tmp_path / "configs", plan)
    top = launch_writer.top_launches(plan, 3)
    assert top[0] is plan.recommended and len(top) == 3
    wanted = {name for r in top if r.strategy.deepspeed for name in r.config_files}
    assert wanted and wanted <= set(written)
    assert set(plan.recommended.config_files) <= set(written)


@pytest.mark.parametrize(("strategy", "precision", "optimizer", "gpu"), [
    ("zero1", "fp16-mixed", "adamw", "t4"), ("zero2", "bf16-mixed", "adamw-fused", "a100-80gb"),
    ("zero2-offload", "fp16-mixed", "adamw", "t4"), ("zero3", "bf16-mixed", "sgd", "a100-80gb"),
    ("zero3-offload", "fp16-mixed", "adamw-fused", "t4"), ("zero1", "fp32", "adamw-8bit", "t4")])
def test_deepspeed_loads_each_json(tmp_path, monkeypatch, strategy, precision, optimizer, gpu) -> None:
    """DeepSpeed's DeepSpeedConfig and DeepSpeedZeroConfig read every ZeRO JSON written: stage, offload, precision,
    micro-batch and optimizer as the remedy says; oomlab reads it back to the same setup."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from oomlab.budget.deepspeed_config import read_deepspeed_config

    setup = _setup(strategy, precision=precision, optimizer=optimizer, gpu=gpu, batch=3, seq=1024)
    files = launch_writer.write_deepspeed_files(tmp_path, setup)
    json_name, yaml_name = files
    raw = json.loads(files[json_name].read_text())
    cfg = _ds_config(raw, 4, monkeypatch)
    zero = DeepSpeedZeroConfig(**raw["zero_optimization"])
    assert cfg.zero_optimization_stage == setup.strategy.zero_stage == zero.stage
    assert cfg.train_micro_batch_size_per_gpu == 3 and cfg.train_batch_size == 12 and cfg.world_size == 4
    assert cfg.float16_config.enabled is (precision == "fp16-mixed")
    assert cfg.bfloat16_config.enabled is (precision == "bf16-mixed")
    assert (zero.offload_optimizer is not None and zero.offload_optimizer.device == "cpu") is \
        setup.strategy.offloads_optimizer
    assert (zero.offload_param is not None and zero.offload_param.device == "cpu") is \
        (setup.strategy is Strategy.ZERO3_OFFLOAD)
    assert (cfg.optimizer_name == "adamw") is (optimizer == "adamw")
    assert zero.reduce_bucket_size == setup.model.hidden_size ** 2  # the HF integration's "auto", written out
    back = read_deepspeed_config(files[json_name], model="llama-13b", gpu=gpu, gpus=4, method="lora", seq=1024,
                                 optimizer=optimizer)
    assert back.setup == setup


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "zero3-offload"])
def test_accelerate_loads_each_deepspeed_config(tmp_path, strategy) -> None:
    """accelerate's loader reads a ZeRO remedy's config: DEEPSPEED from its JSON, zero.Init under stage 3; accelerate
    launch turns it (and the command's --mixed_precision) into the environment the processes read."""
    from accelerate.commands.config.config_args import load_config_from_file

    setup = _setup(strategy, precision="bf16-mixed", gpu="a100-80gb")
    files = launch_writer.write_deepspeed_files(tmp_path, setup)
    json_name, yaml_name = files
    cfg = load_config_from_file(str(files[yaml_name]))
    assert cfg.distributed_type == "DEEPSPEED" and cfg.num_processes == 4
    assert cfg.deepspeed_config == {"deepspeed_config_file": json_name, "zero3_init_flag": strategy != "zero2"}
    env = cpu_launch.launch_env(files[yaml_name], 4, "bf16")
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == json_name
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == str(strategy != "zero2").lower()


def test_deepspeed_json_refuses_other_strategies() -> None:
    with pytest.raises(ValueError, match="strategy 'fsdp2' is not DeepSpeed; those that are: zero1, zero2, zero3"):
        deepspeed_configs.deepspeed_json(_setup("fsdp2"))


def test_launch_doc_has_recommended_command(written, plan) -> None:
    """LAUNCH.md carries the exact command of the recommended remedy, with the model and its precision."""
    rec = plan.recommended
    command = launch_writer.plan_launch_command(plan, rec, "huggyllama/llama-13b")
    assert command in written[launch_files.LAUNCH_DOC].read_text()
    assert f"--batch {rec.setup.batch} " in command  # the ladder's fix launches the micro-batch it chose
    assert command.startswith("accelerate launch --config_file ")
    words = shlex.split(command)
    assert words[words.index("--model") + 1] == "huggyllama/llama-13b"
    assert words[words.index("--mixed_precision") + 1] == deepspeed_configs.ACCELERATE_MIXED_PRECISION[rec.precision]
    assert words[words.index("--config_file") + 1] in rec.config_files


def test_launch_doc_follows_its_settings() -> None:
    """LAUNCH.md names the model, layer, processes and length it is written for, and nothing of the seed's."""
    settings = launch_files.LaunchSettings(num_processes=8, mixed_precision="bf16",
                                           decoder_layer="MistralDecoderLayer", model_id="mistralai/Mistral-7B-v0.1")
    doc = launch_files.launch_doc([], settings, (("deepspeed_zero3_bf16_adamw_b2.json",
                                                  "accelerate_deepspeed_zero3_bf16_adamw_b2.yaml", Strategy.ZERO3,
                                                  "ZeRO-3"),))
    assert "8 processes per machine" in doc and "mixed precision bf16" in doc and "`MistralDecoderLayer`" in doc
    assert "`mistralai/Mistral-7B-v0.1`" in doc
    assert ("| `accelerate_deepspeed_zero3_bf16_adamw_b2.yaml` (→ `deepspeed_zero3_bf16_adamw_b2.json`) | `zero3` |"
            in doc)
    assert "llama" not in doc.lower() and "13b" not in doc
    assert all(f"`{name}` | `{strategy.value}`" in doc for strategy, name in launch_files.ACCELERATE_CONFIG.items())


LORA_ARGS = "--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj --checkpointing"


@pytest.mark.parametrize(("strategy", "optimizer", "precision", "head"), [
    ("fsdp", "adamw", "fp16-mixed",
     "accelerate launch --config_file accelerate_fsdp.yaml --num_processes 4 --mixed_precision fp16 train.py"),
    ("fsdp2", "adamw-fused", "bf16-mixed",
     "accelerate launch --config_file accelerate_fsdp2.yaml --num_processes 4 --mixed_precision bf16 train.py"),
    ("fsdp2-offload", "adamw-8bit", "fp32",
     "accelerate launch --config_file accelerate_fsdp2_offload.yaml --num_processes 4 --mixed_precision no "
     "train.py"),
    ("single", "sgd", "fp16-mixed", "accelerate launch --num_processes 1 --mixed_precision fp16 train.py"),
    # DeepSpeed: its own accelerate config, named for the precision, optimizer and the micro-batch launched
    ("zero3", "adamw", "bf16-mixed", "accelerate launch --config_file accelerate_deepspeed_zero3_bf16_adamw_b2.yaml "
     "--num_processes 4 --mixed_precision bf16 train.py"),
    ("zero2-offload", "adamw-fused", "fp16-mixed", "accelerate launch --config_file "
     "accelerate_deepspeed_zero2_offload_fp16_adamw_fused_b2.yaml --num_processes 4 --mixed_precision fp16 train.py"),
])
def test_launch_command_uses_the_strategy_config(plan, strategy, optimizer, precision, head) -> None:
    """The command launches the strategy's config with the remedy's precision and passes its model, method (with
    the family's LoRA targets), micro-batch, optimizer and checkpointing."""
    gpus = 1 if strategy == "single" else 4
    setup = _setup(strategy, optimizer=optimizer, precision=precision, gpu="a100-80gb", gpus=gpus, lora_rank=16,
                   lora_alpha=32, checkpointing=True, seq=1024)
    remedy = replace(plan.recommended, strategy=setup.strategy, optimizer=setup.optimizer,
                     precision=setup.precision, method=Method.LORA, checkpointing=True, max_batch=2, setup=setup)
    command = launch_writer.launch_command(remedy, "org/model", 1024, 16, 4)
    assert command == (f"{head} --model org/model --method lora --seq 1024 --batch 2 --optimizer {optimizer} "
                       f"{LORA_ARGS}")


def test_launch_command_of_a_remedy_read_back(plan) -> None:
    """A remedy read back from results JSON (no setup) still gets the command its fields give."""
    remedy = replace(plan.recommended, strategy=Strategy.FSDP2, method=Method.LORA, precision=Precision.BF16_MIXED,
                     optimizer=Optimizer.ADAMW, checkpointing=False, max_batch=20, setup=None)
    assert launch_writer.launch_command(remedy, "org/model", 512, 8, 2) == (
        "accelerate launch --config_file accelerate_fsdp2.yaml --num_processes 2 --mixed_precision bf16 train.py "
        "--model org/model --method lora --seq 512 --batch 8 --optimizer adamw --lora-rank 8")


@pytest.mark.parametrize(("route", "strategy", "precision"), [
    (Route.DEVICE_MAP, Strategy.SINGLE, Precision.FP16_MIXED),  # one process spread over the GPUs
    (Route.PROCESS_PER_GPU, Strategy.FSDP, Precision.BF16),  # pure bf16: train.py keeps fp32 trainable weights
])
def test_launch_command_none_without_a_launch(plan, route, strategy, precision) -> None:
    """No command where no launch file runs the remedy."""
    remedy = replace(plan.recommended, route=route, strategy=strategy, precision=precision)
    assert launch_writer.launch_command(remedy, "org/model", 1024) is None


# a family of each naming: LLaMA's, Mistral's, Qwen2's, GPT-NeoX's (no "Decoder"), Phi-3's
@pytest.mark.parametrize(("model", "layer"), [
    ("llama-13b", "LlamaDecoderLayer"), ("mistral-7b", "MistralDecoderLayer"), ("qwen2.5-7b", "Qwen2DecoderLayer"),
    ("gpt-neox-20b", "GPTNeoXLayer"), ("phi-3-mini-4k", "Phi3DecoderLayer"), ("mixtral-8x7b", "MixtralDecoderLayer")])
def test_decoder_layer_class_is_the_familys(model, layer) -> None:
    """FSDP wraps the family's own decoder layer, read off the transformers model class's _no_split_modules."""
    assert launch_files.decoder_layer_class(load_model(model)) == layer


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    plan = make_plan(model="mistral-7b", gpu="a100-80gb", gpus=2, precision="bf16-mixed")
    return plan, launch_writer.write_configs(tmp_path_factory.mktemp("mistral"), plan)


def test_launch_files_carry_a_non_llama_model(mistral, monkeypatch) -> None:
    """For mistral-7b every launch file carries the user's model, family, precision and micro-batch: the FSDP configs
    wrap MistralDecoderLayer, train.py defaults to Mistral's hub id, each command and each DeepSpeed JSON (bf16
    sections launch bf16) matches the remedy it launches."""
    from accelerate.commands.config.config_args import load_config_from_file

    plan, written = mistral
    for name in (launch_files.FSDP, launch_files.FSDP2):
        fsdp = load_config_from_file(str(written[name])).fsdp_config
        assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "MistralDecoderLayer"
    script = written[launch_files.TRAIN_SCRIPT].read_text()
    assert 'DEFAULT_MODEL = "mistralai/Mistral-7B-v0.1"' in script and "llama-13b" not in script
    doc = written[launch_files.LAUNCH_DOC].read_text()
    top = launch_writer.top_launches(plan, 3)
    assert any(r.strategy.deepspeed for r in top)
    for r in top:
        command = launch_writer.plan_launch_command(plan, r, "mistralai/Mistral-7B-v0.1")
        assert command in doc
        words = shlex.split(command)
        batch = int(words[words.index("--batch") + 1])
        assert words[words.index("--model") + 1] == "mistralai/Mistral-7B-v0.1"
        assert batch == (r.setup.batch if r is plan.fix else launch_files.launch_batch(r.max_batch))
        assert words[words.index("--method") + 1] == r.method.value
        mixed = words[words.index("--mixed_precision") + 1]
        assert mixed == deepspeed_configs.ACCELERATE_MIXED_PRECISION[r.precision]
        if r.strategy.deepspeed:
            raw = json.loads(written[next(n for n in r.config_files if n.endswith(".json"))].read_text())
            cfg = _ds_config(raw, plan.gpus, monkeypatch)
            assert cfg.bfloat16_config.enabled is (mixed == "bf16") and cfg.float16_config.enabled is (mixed == "fp16")
            assert cfg.train_micro_batch_size_per_gpu == batch
            assert cfg.zero_optimization_stage == r.strategy.zero_stage


def _train_module():
    spec = importlib.util.spec_from_file_location("oomlab_train_template", TEMPLATES_DIR / "launch" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train


def test_train_script_accepts_every_optimizer() -> None:
    """train.py's --optimizer takes each of oomlab's optimizer choices (and only those)."""
    train = _train_module()
    assert [train.parse_args(["--optimizer", o.value]).optimizer for o in Optimizer] == [o.value for o in Optimizer]
    with pytest.raises(SystemExit):
        train.parse_args(["--optimizer", "lion"])


def test_the_fix_launch_carries_the_loss_kernel() -> None:
    """Qwen2.5-7B LoRA on one RTX 4090 at 4 x 4096: the ladder's fix takes Liger's fused linear cross-entropy; its
    name says so, its command passes --loss liger-flce, and train.py accepts each loss its launches pass (a
    framework's chunked loss -- torchtune's, litgpt's, axolotl's -- gets no launch of oomlab's)."""
    from oomlab.core.choices import Loss
    from oomlab.remedies.plan import plan_for

    plan = plan_for(make_setup(model="qwen2.5-7b", gpu="rtx-4090", gpus=1, method="lora", precision="bf16-mixed",
                               batch=4, seq=4096))
    assert plan.decision.setup.loss is Loss.LIGER_FLCE and plan.fix.name.endswith("loss liger-flce")
    command = launch_writer.plan_launch_command(plan, plan.fix, "Qwen/Qwen2.5-7B")
    assert command.endswith("--loss liger-flce")
    train = _train_module()
    own = [x for x in Loss if not x.chunked]
    assert [train.parse_args(["--loss", x.value]).loss for x in own] == [x.value for x in own]
    chunked = plan_for(make_setup(model="qwen2.5-7b", gpu="rtx-4090", gpus=1, method="lora", precision="bf16-mixed",
                                  batch=4, seq=4096, loss="chunked-loss-compiled"))
    assert chunked.fix is not None
    assert launch_writer.plan_launch_command(chunked, chunked.fix, "Qwen/Qwen2.5-7B") is None


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
    pytest.param(launch_files.FSDP, "full", ["--accumulation", "2"], FSDP1_PATCHES + FP16,  # the ladder's
                 {"distributed_type": "FSDP", "model_class": "FullyShardedDataParallel"},  # micro-batch rung
                 id="fsdp-full-accumulation"),
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


@pytest.mark.heavy
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


DS_PATCHES = ("deepspeed-gloo-backend",)
# ZeRO-2 and ZeRO-3 (+ offload) through their written JSON and accelerate config: accelerate's DeepSpeed path
# (deepspeed.initialize inside prepare) on DeepSpeed's CPU accelerator, 2 gloo processes; bf16 (this CPU's DeepSpeed
# refuses fp16) and the client optimizer adamw-fused (DeepSpeed's own AdamW would JIT-build its CPU op first)
DEEPSPEED_RUNS = [
    pytest.param("zero2", "full", {"zero_stage": 2, "zero_offload_optimizer": False, "zero3_init": False},
                 id="zero2-full"),
    pytest.param("zero3", "lora", {"zero_stage": 3, "zero_offload_optimizer": False, "zero3_init": True},
                 id="zero3-lora-zero-init"),
    pytest.param("zero3-offload", "full", {"zero_stage": 3, "zero_offload_optimizer": True, "zero3_init": True},
                 id="zero3-offload-full"),
]


@pytest.mark.heavy
@pytest.mark.parametrize(("strategy", "method", "prepared"), DEEPSPEED_RUNS)
def test_deepspeed_remedy_trains_two_steps_on_cpu(tmp_path, strategy, method, prepared) -> None:
    """A ZeRO remedy's written JSON and accelerate config, launched with its own command's arguments, train 2 steps
    on 2 gloo processes through accelerate's DeepSpeed prepare: the engine runs the stage, offload, zero.Init,
    precision and micro-batch the JSON says; losses finite (about 10-20 s each)."""
    setup = tiny_setup(None, strategy=strategy, gpus=2, method=method, precision="bf16-mixed",
                       optimizer="adamw-fused", batch=2, seq=32, checkpointing=strategy == "zero3")
    files = launch_writer.write_deepspeed_files(tmp_path, setup)
    (tmp_path / launch_files.TRAIN_SCRIPT).write_text(launch_writer.train_script("org/tiny"))
    (tmp_path / "tiny.json").write_text(json.dumps({"model_type": setup.model.model_type, **setup.model.config}))
    command = shlex.split(deepspeed_configs.launch_command(setup, "org/tiny"))
    config, mixed = command[command.index("--config_file") + 1], command[command.index("--mixed_precision") + 1]
    assert config in files and mixed == "bf16"
    args = command[command.index(launch_files.TRAIN_SCRIPT) + 1:]
    log = tmp_path / "log.jsonl"
    results = cpu_launch.run_on_cpu(tmp_path, config, [*args, "--tiny-config", str(tmp_path / "tiny.json"),
                                                       "--steps", "2", "--log-json", str(log)], mixed_precision=mixed)
    for r in results:
        assert r.exit_code == 0, r.output[-3000:]
    assert [r.patches for r in results] == [DS_PATCHES, DS_PATCHES]
    assert "2 processes, DistributedType.DEEPSPEED, mixed precision bf16" in results[0].output
    records = [json.loads(line) for line in log.read_text().splitlines()]
    built = records[0]["prepared"]
    assert {k: built.get(k) for k in prepared} == prepared
    assert built["distributed_type"] == "DEEPSPEED" and built["model_class"] == "DeepSpeedEngine"
    assert built["micro_batch"] == 2 and built["deepspeed_optimizer"] == "AdamW"
    assert built["forward"] == {"autocast": None, "weight_dtype": "bfloat16"}  # DeepSpeed casts, no autocast
    assert [r["step"] for r in records[1:]] == [1, 2]
    assert all(0 < r["loss"] < float("inf") for r in records[1:])


def test_dummy_optimizer_under_a_deepspeed_optimizer_block() -> None:
    """train.py hands accelerate a DummyOptim where the DeepSpeed JSON builds its own optimizer (oomlab's adamw),
    its own torch optimizer otherwise."""
    from types import SimpleNamespace

    import torch
    from accelerate.utils import DummyOptim

    train = _train_module()
    params = [torch.nn.Parameter(torch.zeros(2))]
    args = train.parse_args(["--optimizer", "adamw"])

    def accelerator(config):
        return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config)))

    assert isinstance(train.make_optimizer(args, params, accelerator({"optimizer": {"type": "AdamW"}})), DummyOptim)
    assert type(train.make_optimizer(args, params, accelerator({}))) is torch.optim.AdamW
    assert type(train.make_optimizer(args, params)) is torch.optim.AdamW


def test_cpu_patches_are_named_with_a_reason() -> None:
    """Every CPU patch has a unique name and a reason that cites the source it works around."""
    assert len(cpu_launch.CPU_PATCHES) == len({p.name for p in cpu_launch.CPU_PATCHES.values()})
    assert all(".py:" in p.reason for p in cpu_launch.CPU_PATCHES.values())
    used = {name for param in CPU_RUNS for name in param.values[3]} | set(DS_PATCHES)
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


@pytest.mark.heavy
def test_deepspeed_json_and_script_accumulate_alike(tmp_path) -> None:
    """The ladder's micro-batch rung on DeepSpeed: the JSON's gradient_accumulation_steps is the command's
    --accumulation, and accelerate's DeepSpeed prepare accepts the pair (it refuses a mismatch); 2 steps train."""
    setup = tiny_setup(None, strategy="zero2", gpus=2, method="full", precision="bf16-mixed",
                       optimizer="adamw-fused", batch=1, seq=32)
    files = {name: tmp_path / name for name in launch_writer.deepspeed_texts(setup, 2)}
    for name, text in launch_writer.deepspeed_texts(setup, 2).items():
        files[name].write_text(text)
    (tmp_path / launch_files.TRAIN_SCRIPT).write_text(launch_writer.train_script("org/tiny"))
    (tmp_path / "tiny.json").write_text(json.dumps({"model_type": setup.model.model_type, **setup.model.config}))
    command = shlex.split(deepspeed_configs.launch_command(setup, "org/tiny", accumulation=2))
    config = command[command.index("--config_file") + 1]
    json_name = next(n for n in files if n.endswith(".json"))
    assert json.loads(files[json_name].read_text())["gradient_accumulation_steps"] == 2 and "_a2" in json_name
    args = command[command.index(launch_files.TRAIN_SCRIPT) + 1:]
    assert args[args.index("--accumulation") + 1] == "2"
    log = tmp_path / "log.jsonl"
    results = cpu_launch.run_on_cpu(tmp_path, config, [*args, "--tiny-config", str(tmp_path / "tiny.json"),
                                                       "--steps", "2", "--log-json", str(log)], mixed_precision="bf16")
    for r in results:
        assert r.exit_code == 0, r.output[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records[1:]] == [1, 2]
