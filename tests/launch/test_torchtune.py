"""torchtune's launch read (oomlab.launch.torchtune) and its fixes (oomlab.launch.torchtune_fix): ``tune run <recipe>
--config <config> key=value ...`` with a built-in config (copied from torchtune v0.6.1) or the user's YAML, each
field with its origin, torchtune's refusals, and a fix written as torchtune reads it -- launchable as printed."""

import json
from pathlib import Path

import pytest
import yaml

from oomlab.core.choices import Loss, Method, Optimizer, Precision, Strategy
from oomlab.core.errors import InvalidValueError, UnknownNameError, UnmodelledSettingError
from oomlab.core.models import load_model
from oomlab.core.setup import make_setup
from oomlab.core.versions import versions_from
from oomlab.evidence.published import load_rows
from oomlab.launch.check import check
from oomlab.launch.command import Launcher, parse_command
from oomlab.launch.inputs import check_inputs
from oomlab.launch.paths import LoadPath, load_path_of
from oomlab.launch.resolve import read_launch
from oomlab.launch.torchtune import BUILDERS, CONFIGS_DIR, RECIPES, builder_model
from oomlab.remedies.ladder import Rung, Step, _apply

README_QLORA = ("tune run lora_finetune_single_device --config llama3_2/3B_qlora_single_device dataset.packed=True "
                "compile=True loss=torchtune.modules.loss.CEWithChunkedOutputLoss enable_activation_checkpointing=True "
                "optimizer_in_bwd=False enable_activation_offloading=True optimizer=torch.optim.AdamW "
                "tokenizer.max_seq_len=4096 gradient_accumulation_steps=1 epochs=1 batch_size=2")
USER_YAML = """\
model:
  _component_: torchtune.models.llama3_1.lora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  lora_rank: 16
  lora_alpha: 32
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/tokenizer.model
  max_seq_len: 2048
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: True
batch_size: 4
gradient_accumulation_steps: 2
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  lr: 3e-4
lr_scheduler:
  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup
  num_warmup_steps: 100
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
compile: False
dtype: bf16
enable_activation_checkpointing: False
"""


def _yaml(tmp_path: Path, text: str = USER_YAML, **changes: object) -> str:
    data = yaml.safe_load(text)
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    path = tmp_path / "my_config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _line(path: str, key: str) -> int:
    return next(i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if line.startswith(f"{key}:"))


def _read(command: str, gpu: str = "a100-80gb", **kwargs):
    return read_launch(check_inputs(launch=command, gpu=gpu, **kwargs))


def test_the_copied_configs_and_their_index() -> None:
    """index.json names torchtune v0.6.1's commit; each config it lists is there, registered under a recipe oomlab
    reads, and builds a shipped model."""
    index = json.loads((CONFIGS_DIR / "index.json").read_text())
    assert index["release"] == "0.6.1" and len(index["commit"]) == 40 and "BSD-3-Clause" in index["about"]
    assert len(index["configs"]) >= 70
    for name, entry in index["configs"].items():
        data = yaml.safe_load((CONFIGS_DIR / entry["file"]).read_text())
        assert builder_model(data["model"]["_component_"]) is not None, name
        assert set(entry["recipes"]) <= set(RECIPES), name
    assert all(load_model(model) for model in set(BUILDERS.values()))


def test_the_readme_command_reads_the_setup_its_published_row_is_compared_with() -> None:
    """torchtune's README prints the QLoRA row's command in full: read at the row's release it is, field for field,
    the setup docs/published-measurements.md compares with (4.6 GiB active measured)."""
    row = next(r for r in load_rows() if r.id == "torchtune-readme-flags-3b-qlora")
    launch = _read(README_QLORA, versions=versions_from("torchtune==0.4.0"))
    assert launch.setup == make_setup(**row.setup_kwargs)
    f = launch.fields
    assert str(f["optimizer"].origin).endswith("optimizer.fused")  # the YAML's fused: True survives the override
    assert str(f["loss"].origin) == "flag loss._component_=torchtune.modules.loss.CEWithChunkedOutputLoss"
    assert str(f["method"].origin).startswith("torchtune 0.6.1's built-in config llama3_2/3B_qlora_single_device:")
    assert f["torchtune"].value == "0.4.0" and launch.launcher is Launcher.TUNE
    assert launch.files == ()  # a built-in config is torchtune's, never rewritten as the user's
    assert any("read at torchtune 0.6.1" in u.why for u in launch.unmodelled)
    assert load_path_of(launch.setup) is LoadPath.TORCHTUNE_BUILD


def test_a_user_yaml_every_decisive_field(tmp_path: Path) -> None:
    path = _yaml(tmp_path)
    launch = _read(f"tune run lora_finetune_single_device --config {path}")
    s, f = launch.setup, launch.fields
    assert (s.model.name, s.method, s.precision, s.optimizer) == ("llama-3.1-8b", Method.LORA, Precision.BF16,
                                                                  Optimizer.ADAMW_FUSED)
    assert (s.batch, s.seq, s.lora_rank, s.lora_alpha, s.checkpointing, s.loss) == (4, 2048, 16, 32, False,
                                                                                     Loss.CHUNKED)
    assert s.lora_targets == ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert f["accumulation"].value == 2 and str(f["batch"].origin) == f"{path}:{_line(path, 'batch_size')} batch_size"
    assert s.strategy is Strategy.SINGLE and "one process" in str(f["strategy"].origin)
    assert f["torchtune"].value == "0.6.1" and "give --versions torchtune==X" in str(f["torchtune"].origin)
    assert launch.files == (path,)
    assert s.versions.framework == "torchtune"


@pytest.mark.parametrize("overrides, field, value", [
    ("compile=True", "loss", Loss.CHUNKED_COMPILED),
    ("loss=torch.nn.CrossEntropyLoss", "loss", Loss.STANDARD),
    ("optimizer=bitsandbytes.optim.PagedAdamW8bit ~optimizer.fused", "optimizer", Optimizer.ADAMW_8BIT),
    ("~optimizer.fused", "optimizer", Optimizer.ADAMW),
    ("optimizer.fused=False", "optimizer", Optimizer.ADAMW),
    ("model=torchtune.models.llama3_1.qlora_llama3_1_8b", "method", Method.QLORA),
    ("model.quantize_base=True", "method", Method.QLORA),
    ("dtype=fp32", "precision", Precision.FP32),
    ("dtype=None", "precision", Precision.FP32),
    ("enable_activation_checkpointing=True enable_activation_offloading=True", "offload_activations", True),
    ("enable_activation_checkpointing=true", "checkpointing", True),
    ("batch_size=1", "batch", 1),
    ("tokenizer.max_seq_len=8192", "seq", 8192),
    ("model.apply_lora_to_mlp=False", "lora_targets", ("q_proj", "v_proj", "o_proj")),
])
def test_overrides(tmp_path: Path, overrides: str, field: str, value: object) -> None:
    """key=value after the config wins over the YAML, read as OmegaConf reads it (a component key names its
    _component_; ~key drops a key; None is null)."""
    launch = _read(f"tune run lora_finetune_single_device --config {_yaml(tmp_path)} {overrides}")
    assert launch.fields[field].value == value


def test_a_paged_optimizer_is_listed(tmp_path: Path) -> None:
    launch = _read(f"tune run lora_finetune_single_device --config {_yaml(tmp_path)} "
                   "optimizer=bitsandbytes.optim.PagedAdamW8bit ~optimizer.fused")
    assert any("CUDA managed memory" in u.why for u in launch.unmodelled)


@pytest.mark.parametrize("command, changes, error, match", [
    ("tune run lora_dpo_single_device --config {y}", {}, UnknownNameError, "lora_finetune_single_device"),
    ("tune run lora_finetune_single_device --config llama3_2/3B_nope", {}, UnknownNameError,
     "llama3_2/3B_qlora_single_device"),
    ("tune run lora_finetune_single_device", {}, InvalidValueError, "needs --config"),
    ("tune run lora_finetune_single_device --config {y} dtype=fp16", {}, InvalidValueError, "refuse fp16"),
    ("tune run full_finetune_single_device --config {y}", {"optimizer_in_bwd": False}, InvalidValueError,
     "use a base builder"),
    ("tune run --nproc_per_node 2 lora_finetune_single_device --config {y}", {}, InvalidValueError,
     "does not support distributed training"),
    ("tune run lora_finetune_single_device --config {y}", {"tokenizer__max_seq_len": None, "dataset__packed": False},
     InvalidValueError, "pass --seq N"),
    ("tune run lora_finetune_single_device --config {y}", {"tokenizer__max_seq_len": None}, InvalidValueError,
     "refuses packing without it"),
    ("tune run lora_finetune_single_device --config {y}", {"batch_size": None}, InvalidValueError, "no batch_size"),
    ("tune run lora_finetune_single_device --config {y}", {"model___component_": "torchtune.models.x.lora_x_1b"},
     UnknownNameError, "lora_llama3_1_8b"),
    ("tune run lora_finetune_single_device --config {y} optimizer=torchao.optim.AdamW8bit", {}, UnknownNameError,
     "bitsandbytes.optim.AdamW8bit"),
    ("tune run lora_finetune_single_device --config {y} loss=torchtune.modules.loss.LinearCrossEntropyLoss", {},
     UnmodelledSettingError, "not budgeted"),
    ("tune run --nproc_per_node 2 lora_finetune_distributed --config {y} ac_mode=selective", {},
     UnmodelledSettingError, "selective"),
    ("tune download meta-llama/Llama-3.2-3B", {}, InvalidValueError, "does not train"),
    ("tune run lora_finetune_single_device --config {y} enable_activation_offloading=True", {}, InvalidValueError,
     "should only be True when enable_activation_checkpointing"),
    ("tune run lora_finetune_single_device --config {y} ~loss", {}, InvalidValueError, "removing a component"),
    ("tune run lora_finetune_single_device --config {y} ~dataset.nope", {}, InvalidValueError,
     "no dataset.nope to remove"),
    ("tune run lora_finetune_single_device --config {y} ~compile", {}, InvalidValueError, "Missing key compile"),
    ("tune run lora_finetune_single_device --config {y}", {"dtype": None}, InvalidValueError, "Missing key dtype"),
    ("tune run lora_finetune_single_device --config {y} dtype=BF16", {}, InvalidValueError, "lower case"),
    ("tune run lora_finetune_single_device --config {y} --batch_size 64", {}, InvalidValueError,
     "Additional flag arguments"),
    ("tune run lora_finetune_distributed --config {y}", {}, InvalidValueError, "distributed launcher"),
    ("tune run --standalone lora_finetune_single_device --config {y}", {}, InvalidValueError,
     "does not support distributed"),
    ("tune run lora_finetune_single_device --config {y} model.use_dora=True", {}, UnmodelledSettingError, "DoRA"),
    ("tune run lora_finetune_single_device --config {y} model=torchtune.models.qwen2_5.qlora_qwen2_5_7b_instruct",
     {}, InvalidValueError, "quantize_base=True"),
    ("tune run --nproc_per_node 2 lora_finetune_distributed --config {y} optimizer=bitsandbytes.optim.AdamW8bit "
     "~optimizer.fused", {}, InvalidValueError, "single-device recipes"),
    ("tune run full_finetune_single_device --config {y} optimizer_in_bwd=True", {
        "model___component_": "torchtune.models.llama3_1.llama3_1_8b", "model__lora_attn_modules": None,
        "model__apply_lora_to_mlp": None, "model__lora_rank": None, "model__lora_alpha": None},
     InvalidValueError, "Gradient accumulation is not supported with optimizer in bwd"),
])
def test_refused(tmp_path: Path, command: str, changes: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _read(command.format(y=_yaml(tmp_path, **changes)))


def test_bf16_where_the_gpu_lacks_it(tmp_path: Path) -> None:
    """bf16 on a T4: refused with torchtune's way out (fp32: it has no fp16 or mixed precision)."""
    with pytest.raises(InvalidValueError, match="use dtype=fp32"):
        _read(f"tune run lora_finetune_single_device --config {_yaml(tmp_path)}", gpu="t4")
    assert _read(f"tune run lora_finetune_single_device --config {_yaml(tmp_path)} dtype=fp32",
                 gpu="t4").setup.precision is Precision.FP32


def test_every_override_not_read_is_listed(tmp_path: Path) -> None:
    """An override oomlab does not read is listed, whether or not the YAML has the key."""
    launch = _read(f"tune run lora_finetune_single_device --config {_yaml(tmp_path)} "
                   "fsdp_reshard_after_forward=False model.lora_dropout=0.1 some.typo=3 "
                   "model.apply_lora_to_output=True")
    listed = {str(u.origin): u.why for u in launch.unmodelled}
    assert "output head's LoRA adapter, 16 × (4096 + 128256)" in listed["flag model.apply_lora_to_output=True"]
    assert "not modelled" in listed["flag fsdp_reshard_after_forward=False"]
    assert "not modelled" in listed["flag some.typo=3"]
    assert listed["flag model.lora_dropout=0.1"] == "does not change GPU memory"


def test_every_built_in_config_reads() -> None:
    """Each copied config of a single-device recipe reads as torchtune runs it (a length given where it has none)."""
    for name, entry in json.loads((CONFIGS_DIR / "index.json").read_text())["configs"].items():
        for recipe in entry["recipes"]:
            nproc = "--nproc_per_node 2 " if recipe.endswith("distributed") else ""
            launch = _read(f"tune run {nproc}{recipe} --config {name} tokenizer.max_seq_len=1024", gpu="h100-80gb")
            assert launch.setup.model.name == builder_model(yaml.safe_load(
                (CONFIGS_DIR / entry["file"]).read_text())["model"]["_component_"]), name


def test_an_unpacked_dataset_with_no_cap_takes_seq(tmp_path: Path) -> None:
    path = _yaml(tmp_path, tokenizer__max_seq_len=None, dataset__packed=False)
    launch = _read(f"tune run lora_finetune_single_device --config {path}", seq=1024)
    assert launch.setup.seq == 1024


@pytest.mark.parametrize("release, strategy", [("0.6.1", Strategy.FSDP2), ("0.2.1", Strategy.FSDP)])
def test_distributed_recipes_shard(tmp_path: Path, release: str, strategy: Strategy) -> None:
    """*_distributed shards with FSDP2 from torchtune 0.3.0 (FSDP1 before); --nproc_per_node is torchrun's."""
    launch = _read(f"tune run --nproc_per_node 4 lora_finetune_distributed --config {_yaml(tmp_path)}",
                   versions=versions_from(f"torchtune=={release}"))
    assert (launch.setup.gpus, launch.setup.strategy) == (4, strategy)
    offload = _read(f"tune run --nproc_per_node 4 lora_finetune_distributed --config {_yaml(tmp_path)} "
                    "fsdp_cpu_offload=True")
    assert offload.setup.strategy is Strategy.FSDP2_OFFLOAD


def test_optimizer_in_backward_is_budgeted_for_the_full_recipe() -> None:
    launch = _read("tune run full_finetune_single_device --config llama3_2/3B_full_single_device "
                   "tokenizer.max_seq_len=2048")
    assert launch.setup.optimizer_in_backward and launch.setup.optimizer is Optimizer.ADAMW_8BIT
    assert launch.setup.method is Method.FULL and launch.fields["lora_alpha"].value == 16


def test_the_command() -> None:
    cmd = parse_command("tune run --nproc_per_node 2 lora_finetune_distributed --config my.yaml batch_size=2 "
                        "~optimizer.fused")
    assert cmd.launcher is Launcher.TUNE and cmd.script == "lora_finetune_distributed"
    assert cmd.options == (("--nproc_per_node", "2"),)
    assert cmd.flags == (("--config", "my.yaml"), ("batch_size", "2"), ("~optimizer.fused", None))


def _relaunch(command: str, gpu: str, **kwargs):
    """check's fix, then its printed launch read again: the same setup (launchable as printed)."""
    result = check(launch=command, gpu=gpu, **kwargs)
    fix = result.smallest_fix
    assert fix is not None
    again = read_launch(check_inputs(launch=fix.launch, gpu=gpu, **kwargs))
    return fix, again


def test_a_full_finetune_fix_is_launchable_as_printed() -> None:
    """8B full fine-tuning with torch AdamW on a 4090: the fix's command (LoRA recipe, builder, adapter keys, the
    scheduler the LoRA recipe steps) reads back as the setup the fix budgeted."""
    fix, again = _relaunch("tune run full_finetune_single_device --config llama3_1/8B_full_single_device "
                           "batch_size=4 tokenizer.max_seq_len=4096 optimizer=torch.optim.AdamW "
                           "optimizer_in_bwd=False", "rtx-4090")
    assert "lora_finetune_single_device" in fix.launch and "lr_scheduler._component_=" in fix.launch
    assert again.setup == fix.setup


def test_an_optimizer_fix_drops_fused_where_the_yaml_has_it(tmp_path: Path) -> None:
    """bitsandbytes' AdamW8bit takes no fused: the fix drops the YAML's key with ~optimizer.fused."""
    path = _yaml(tmp_path, model___component_="torchtune.models.llama3_2.llama3_2_3b", model__lora_attn_modules=None,
                 model__apply_lora_to_mlp=None, model__lora_rank=None, model__lora_alpha=None,
                 enable_activation_checkpointing=True, batch_size=1, gradient_accumulation_steps=1,
                 optimizer_in_bwd=False)
    fix, again = _relaunch(f"tune run full_finetune_single_device --config {path}", "rtx-4090")
    assert again.setup == fix.setup and fix.setup.optimizer is Optimizer.ADAMW_8BIT
    assert "optimizer._component_=bitsandbytes.optim.AdamW8bit ~optimizer.fused" in fix.launch


def test_a_fix_in_the_users_yaml(tmp_path: Path) -> None:
    """A field the user's YAML sets is changed there (batch_size, gradient_accumulation_steps), not on the command."""
    path = _yaml(tmp_path, batch_size=16, tokenizer__max_seq_len=8192)
    result = check(launch=f"tune run lora_finetune_single_device --config {path}", gpu="rtx-4090")
    fix = result.smallest_fix
    assert fix is not None and fix.files
    keys = {e.key for f in fix.files for e in f.edits}
    assert keys and all(not w.startswith(tuple(f"{k}=" for k in keys)) for w in fix.launch.split())


def test_torchtune_0_1_qlora_init_fix_is_the_upgrade() -> None:
    """torchtune 0.1's QLoRA init (unchunked NF4) decides a 70B QLoRA on an A6000: the fix is the release."""
    result = check(launch="tune run lora_finetune_single_device --config llama2/7B_qlora_single_device "
                          "model=torchtune.models.llama2.qlora_llama2_70b tokenizer.max_seq_len=512 batch_size=1",
                   gpu="rtx-a6000", versions=versions_from("torchtune==0.1.0"), host_ram="256GiB")
    fix = result.smallest_fix
    assert fix is not None and fix.changes[0][0] == "versions" and "torchtune==0.2.0" in fix.changes[0][1]


@pytest.mark.parametrize("rung", [Rung.OFFLOAD, Rung.FUSED_LOSS])
def test_the_ladder_offers_torchtune_no_liger_and_no_deepspeed(rung: Rung) -> None:
    """The same single-GPU setup: the HF stack gets ZeRO-2 offload and Liger's loss, torchtune (whose recipes run
    neither) does not."""
    kwargs = {"model": "llama-3.1-8b", "gpu": "rtx-4090", "gpus": 1, "method": "full", "precision": "bf16-mixed",
              "batch": 1, "seq": 512}
    hf = make_setup(**kwargs, versions={"transformers": "4.48.1"})
    tune = make_setup(**kwargs, versions={"torchtune": "0.6.1"})
    assert _apply(rung, Step(Rung.FUSED_OPTIMIZER, hf, 1), lambda s: True) is not None
    assert _apply(rung, Step(Rung.FUSED_OPTIMIZER, tune, 1), lambda s: True) is None


def test_an_override_with_a_yaml_anchor_stays_text(tmp_path: Path) -> None:
    """An alias bomb in an override is not expanded: the value is refused as text, in milliseconds."""
    bomb = "[&a [x,x,x,x,x,x,x,x,x],&b [*a,*a,*a,*a,*a,*a,*a,*a,*a],&c [*b,*b,*b,*b,*b,*b,*b,*b,*b]]"
    with pytest.raises(UnknownNameError, match="lora_attn_modules"):
        _read(f"tune run lora_finetune_single_device --config {_yaml(tmp_path)} model.lora_attn_modules={bomb}")


def test_the_knob_table_and_other_launches_are_torchtune_s(tmp_path: Path) -> None:
    """The configuration that decides it, and the other launches of the same run: only the strategies and dtypes
    torchtune's recipes run (FSDP2 at 0.6.1; bf16 or fp32)."""
    from oomlab.launch.check import other_launches
    from oomlab.remedies.knobs import knob_table
    launch = _read(f"tune run --nproc_per_node 2 lora_finetune_distributed --config {_yaml(tmp_path)}")
    rows = knob_table(launch.setup, 256 * 2**30)
    strategies = {v for r in rows for k, v in r.changes if k == "strategy"}
    precisions = {v for r in rows for k, v in r.changes if k == "precision"}
    assert strategies <= {"single", "fsdp2-offload"} and precisions <= {"fp32"}
    assert [r[0] for r in other_launches(launch)] == ["fsdp2 (as launched)", "fsdp2-offload"]  # single: 2 GPUs


def test_plan_ranks_only_what_torchtune_runs() -> None:
    """The plan's grid for a torchtune run: its recipes' strategies and dtypes, each launched by tune run; pure bf16 is
    torchtune's way (no mixed precision in its recipes), not a harmful caveat there."""
    from oomlab.remedies.plan import make_plan
    from oomlab.remedies.remedy import launcher
    plan = make_plan(model="llama-3.1-8b", gpu="a10g", gpus=1, seq=4096, batch=4, precision="bf16", method="lora",
                     optimizer="adamw-fused", versions={"torchtune": "0.6.1"})
    rows = [r for r in plan.remedies if r.name != "as configured"]
    assert rows and all(r.strategy.value in ("single", "fsdp2", "fsdp2-offload") for r in rows)
    assert all(r.precision in (Precision.BF16, Precision.FP32) for r in rows)
    assert all("tune run" in launcher(r.route, r.strategy, r.framework) for r in rows)
    assert not any(c.harmful and "pure half" in c.text for r in rows for c in r.caveats) and plan.fix is not None


def test_an_assumed_release_says_so() -> None:
    """No --versions: torchtune's release is oomlab's assumption, in the launch's field and in the budget's notes."""
    from oomlab.budget import estimate_setup
    from oomlab.core.versions import Origin
    launch = _read("tune run full_finetune_single_device --config llama3_2/3B_full_single_device "
                   "tokenizer.max_seq_len=2048 optimizer=torch.optim.AdamW optimizer.fused=True")
    assert launch.setup.versions.origin("torchtune") is Origin.ASSUMED
    assert launch.setup.optimizer is Optimizer.ADAMW_FUSED
    notes = " ".join(estimate_setup(launch.setup).notes)
    assert "torchtune 0.6.1 (assumed" in notes and "the HF Trainer's default" not in notes


def test_notes_follow_the_framework_whatever_was_budgeted_before() -> None:
    """The launch note is memoised: a torchtune setup budgeted first must not give an HF setup its adapters' words."""
    from oomlab.budget import estimate_setup
    kwargs = {"model": "llama-3.2-3b", "gpu": "a100-80gb", "gpus": 1, "method": "lora", "precision": "bf16",
              "optimizer": "adamw-fused"}
    tune = " ".join(estimate_setup(make_setup(**kwargs, versions={"torchtune": "0.6.1"})).notes)
    hf = " ".join(estimate_setup(make_setup(**kwargs)).notes)
    assert "torchtune's adapters in bf16" in tune and "HF Trainer's default" not in tune
    assert "peft's adapters in fp32" in hf and "HF Trainer's default" in hf


def test_accumulation_turns_optimizer_in_backward_off() -> None:
    """torchtune accumulates only without optimizer_in_bwd: a smaller micro-batch fix says optimizer_in_bwd=False, and
    reads back as the setup it budgeted."""
    fix, again = _relaunch("tune run full_finetune_single_device --config llama3_2/3B_full_single_device "
                           "batch_size=8 tokenizer.max_seq_len=4096", "rtx-4090")
    assert "gradient_accumulation_steps=4 optimizer_in_bwd=False" in fix.launch and not fix.setup.optimizer_in_backward
    assert again.setup == fix.setup


@pytest.mark.parametrize("given, fused_words", [
    ("~optimizer.fused", ["~optimizer.fused"]),  # dropped once, not twice
    ("optimizer.fused=True", ["~optimizer.fused"]),  # the override goes, the YAML's key with it
])
def test_an_8bit_fix_leaves_no_fused(tmp_path: Path, given: str, fused_words: list[str]) -> None:
    from oomlab.launch import torchtune_fix
    launch = _read(f"tune run lora_finetune_single_device --config {_yaml(tmp_path)} {given}")
    text = torchtune_fix.fixed(launch, [("optimizer", launch.setup.with_(optimizer=Optimizer.ADAMW_8BIT))], 1, set())
    assert [w for w in text.split() if "optimizer.fused" in w] == fused_words
    assert _read(text).setup.optimizer is Optimizer.ADAMW_8BIT


def test_qlora_where_the_family_has_no_qlora_builder() -> None:
    """Qwen2.5 has lora_ builders only: its QLoRA is model.quantize_base=True, and reads back as QLoRA."""
    fix, again = _relaunch("tune run lora_finetune_single_device --config qwen2_5/7B_lora_single_device "
                           "tokenizer.max_seq_len=8192 batch_size=8", "l4")
    assert fix.setup.method is Method.QLORA
    assert "model.quantize_base=True" in fix.launch and "qlora_" not in fix.launch
    assert again.setup == fix.setup


def test_no_8bit_optimizer_under_torchtune_fsdp() -> None:
    setup = make_setup(model="llama-3.1-70b", gpu="a100-80gb", gpus=8, strategy="fsdp2", method="full",
                       precision="bf16", versions={"torchtune": "0.6.1"})
    assert _apply(Rung.OPTIMIZER_8BIT, Step(Rung.FUSED_OPTIMIZER, setup, 1), lambda s: True) is None


def test_a_quoted_value_is_never_cut() -> None:
    from oomlab.report.story import shell_lines
    text = shell_lines("tune run lora_finetune_single_device --config c.yaml 'metric_logger.name=run a=b' batch_size=1",
                       overrides=True)
    assert "'metric_logger.name=run a=b'" in text.replace(" \\\n    ", " ")
    assert all(line.count("'") % 2 == 0 for line in text.splitlines())


def test_the_hardware_search_says_whose_launches_it_ranks() -> None:
    from oomlab.report.hardware import scope
    assert scope({"budget": {"configured": {"framework": "transformers"}}}) == ""
    assert "not torchtune's" in scope({"budget": {"configured": {"framework": "torchtune"}}})
