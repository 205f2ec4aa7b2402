"""oomlab check: load before step, the load path's figure, and the fix only when something fails."""

from pathlib import Path

import pytest

from oomlab.budget.result import Phase
from oomlab.core.choices import Loss, Method, Optimizer, Route, Strategy
from oomlab.core.models import load_model
from oomlab.core.units import ceil_div
from oomlab.launch.check import FailsAt, _how, check_launch
from oomlab.launch.inputs import check_inputs
from oomlab.launch.paths import ROWS, LoadPath
from oomlab.launch.read import LaunchInputs
from oomlab.remedies.knobs import knob_table
from oomlab.remedies.ladder import Rung, Step
from oomlab.reproduction.outside import case_outside


def test_zero3_without_zero_init_fails_at_load(tmp_path: Path) -> None:
    """accelerate's inline DeepSpeed ZeRO-3 with zero3_init_flag false: the engine moves the half replica with
    .to() -- a load failure on a T4 -- while the same launch under zero.Init loads."""
    acc = tmp_path / "accelerate_ds.yaml"
    acc.write_text("distributed_type: DEEPSPEED\nnum_processes: 4\nmixed_precision: fp16\ndeepspeed_config:\n"
                   "  zero_stage: 3\n  zero3_init_flag: false\n")
    r = check_launch(LaunchInputs(accelerate_config=str(acc), model="llama-13b", gpu="t4"))
    assert r.launch.setup.strategy is Strategy.ZERO3 and not r.launch.zero3_init
    assert str(r.launch.fields["zero3_init"].origin).endswith("accelerate_ds.yaml:6 deepspeed_config.zero3_init_flag")
    assert r.load.path is LoadPath.DEEPSPEED_TO and r.fails_at is FailsAt.LOAD
    # phase is the step's alone: a load failure has none, and the JSON names the load path as it always has
    assert r.phase is None and r.to_dict()["phase"] == f"load: {ROWS[LoadPath.DEEPSPEED_TO].how}"
    acc.write_text("distributed_type: DEEPSPEED\nnum_processes: 4\nmixed_precision: fp16\ndeepspeed_config:\n"
                   "  zero_stage: 3\n  zero3_init_flag: true\n")
    r = check_launch(LaunchInputs(accelerate_config=str(acc), model="llama-13b", gpu="t4"))
    assert r.load.path is LoadPath.ZERO_INIT and r.load.fits


def test_a_fitting_launch_has_no_fix() -> None:
    """LoRA on a 7B that loads and fits: fails_at None, no fix, the step's peak under capacity."""
    r = check_launch(LaunchInputs(command="torchrun --nproc_per_node 2 train.py --per_device_train_batch_size 1 "
                                  "--bf16 --gradient_checkpointing --max_seq_length 512 --use_peft --lora_r 16",
                                  model="llama-2-7b",
                                  gpu="a100-80gb"))
    assert r.fails_at is None and r.smallest_fix is None and r.phase is None
    assert r.per_gpu_peak_bytes == r.budget.per_gpu_peak_bytes <= r.budget.capacity_bytes
    data = r.to_dict()
    assert {"fails_at", "phase", "per_gpu_peak_bytes", "setup", "smallest_fix"} <= set(data)


def test_step_failure_names_the_phase(tmp_path: Path) -> None:
    """A launch that loads (ZeRO-3 under zero.Init) but not steps: fails_at step, in one of the step's phases, and
    the fix it proposes loads and fits."""
    r = check_launch(LaunchInputs(command="torchrun --nproc_per_node 4 train.py --fsdp 'full_shard auto_wrap' --fp16 "
                                  "--per_device_train_batch_size 1", model="llama-13b", gpu="t4"))
    assert r.load.fits and r.fails_at is FailsAt.STEP
    assert isinstance(r.phase, Phase) and r.phase is r.budget.peak_phase and r.to_dict()["phase"] == r.phase.value
    fix = r.smallest_fix
    assert fix is not None and fix.load.fits and fix.per_gpu_peak_bytes <= r.budget.capacity_bytes


def test_fsdp_load_is_the_shard_and_one_decoder_layer() -> None:
    """The FSDP load holds the shard and one unsharded decoder layer (``spec.layer_params``: the LM head is not a
    layer's), in integers: llama-13b on 4 x T4 in fp16."""
    r = check_launch(LaunchInputs(command="torchrun --nproc_per_node 4 train.py --fsdp 'full_shard auto_wrap' --fp16 "
                                  "--per_device_train_batch_size 1", model="llama-13b", gpu="t4"))
    spec = load_model("llama-13b")
    outside = case_outside("llama-13b", r.launch.setup.gpu, 1).total_bytes
    assert r.load.path is LoadPath.FSDP2_SHARDS
    assert r.load.per_gpu_bytes == ceil_div(spec.num_parameters, 4) * 2 + spec.layer_params * 2 + outside
    assert spec.layer_params == 317_204_480 and r.load.per_gpu_bytes == 7_730_594_877


@pytest.fixture(scope="module")
def no_command():
    """llama-13b on 4 x T4 with no files: everything assumed (DDP, full fine-tuning, fp16-mixed)."""
    return check_launch(check_inputs(model="llama-13b", gpu="t4", gpus=4))


def test_knob_rows_carry_the_typed_change(no_command) -> None:
    """A knob row holds the changed setup and the route: zero3-offload is ZeRO-3 with offload on a process per GPU,
    device-map is the device_map route over one process (strategy single) -- what ``check`` reads, not the text."""
    rows = {r.changes: r for r in knob_table(no_command.launch.setup, no_command.host_ram_bytes)}
    offload = rows[(("strategy", "zero3-offload"),)]
    assert offload.setup.strategy is Strategy.ZERO3_OFFLOAD and offload.route is Route.PROCESS_PER_GPU
    device_map = rows[(("strategy", "device-map"),)]
    assert device_map.setup.strategy is Strategy.SINGLE and device_map.route is Route.DEVICE_MAP
    pair = rows[(("method", "qlora"), ("checkpointing", "true"))]
    assert pair.setup.method is Method.QLORA and pair.setup.checkpointing is True


def test_how_reads_the_setup_not_the_shown_text(no_command) -> None:
    """Where to make a change comes from the changed setup of each ladder step, with what it costs."""
    launch, base = no_command.launch, no_command.launch.setup

    def how(rung: Rung, **changes) -> str:
        return _how(launch, Step(rung, base.with_(**changes), 1))

    zero3 = how(Rung.OFFLOAD, strategy=Strategy.ZERO3_OFFLOAD)
    assert zero3.startswith("DeepSpeed ZeRO-3: zero_optimization.stage 3 with offload_optimizer")
    assert "zero.Init" in zero3 and "[costs speed:" in zero3
    zero2 = how(Rung.SHARDING, strategy=Strategy.ZERO2)
    assert zero2.startswith("DeepSpeed ZeRO-2: zero_optimization.stage 2") and "offload" not in zero2.split("[")[0]
    assert how(Rung.SHARDING, strategy=Strategy.FSDP2).startswith('strategy fsdp2: --fsdp "full_shard auto_wrap"')
    assert how(Rung.OPTIMIZER_8BIT, optimizer=Optimizer.ADAMW_8BIT).startswith(
        "optimizer adamw-8bit: --optim adamw_bnb_8bit")
    assert how(Rung.SHORTER_SEQ, seq=512).startswith("seq 512: --max_seq_length 512 [changes the data")
    assert "over a bitsandbytes 4-bit base" in how(Rung.QLORA, method=Method.QLORA)
    assert "[changes what is trained" in how(Rung.LORA, method=Method.LORA)


def test_the_seeds_fix_keeps_full_fine_tuning(no_command) -> None:
    """The assumed 13B full fine-tune on 4 x T4 (DDP) is fixed without changing what is trained: checkpointing,
    8-bit AdamW and FSDP with offload on the same launcher -- not device_map with QLoRA -- and it loads."""
    fix = no_command.smallest_fix
    assert fix is not None and fix.setup.method is Method.FULL
    assert dict(fix.changes) == {"checkpointing": "on", "optimizer": "adamw-8bit", "strategy": "fsdp-offload"}
    assert fix.load.fits and no_command.decision.fixed.fits
    assert no_command.decision.verdict.word == "does not fit"


def test_the_fix_launch_carries_every_change() -> None:
    """The user's own command, changed where the fix says: a flag already given gets its new value, one missing is
    added (a micro-batch lowered with accumulation raised, checkpointing, the sharding), nothing else moves."""
    command = ("torchrun --nproc_per_node 8 train.py --model_name_or_path meta-llama/Llama-2-70b-hf --bf16 "
               "--per_device_train_batch_size 16 --gradient_accumulation_steps 2 --max_seq_length 2048 --output_dir o")
    r = check_launch(check_inputs(launch=command, model="llama-2-70b", gpu="a100-40gb", gpus=8))
    fix = r.smallest_fix
    assert fix is not None and r.fails_at is FailsAt.LOAD  # a 70B replica per 40 GB GPU
    launch = fix.launch
    assert launch.startswith("torchrun --nproc_per_node 8 train.py --model_name_or_path meta-llama/Llama-2-70b-hf")
    knobs = dict(fix.changes)
    assert {"batch", "checkpointing"} <= set(knobs), knobs
    assert f"--per_device_train_batch_size {fix.setup.batch} " in launch
    assert f"--gradient_accumulation_steps {2 * r.decision.accumulation}" in launch  # the user's 2, times
    assert fix.setup.batch * r.decision.accumulation == 16 and "--gradient_checkpointing" in launch
    if "strategy" in knobs:
        assert "--fsdp" in launch or "--deepspeed" in launch
    assert launch.count("--per_device_train_batch_size") == 1 and "--max_seq_length 2048" in launch


def test_the_verdict_counts_host_ram() -> None:
    """A ZeRO-3 offload run whose GPUs hold it but whose host RAM does not fails at host-ram, not "fits"."""
    from oomlab.launch.user import user_launch
    from oomlab.pipeline.params import PARAMETERS, parse_params

    launch = user_launch(parse_params(["model=llama-2-70b", "gpu=a100-80gb", "gpus=8", "strategy=zero3-offload",
                                       "precision=bf16-mixed", "checkpointing=true"]),
                         {name: p.default for name, p in PARAMETERS.items()})
    r = check_launch(LaunchInputs(gpu="a100-80gb"), host_ram="256GB", launch=launch)
    assert r.budget.fits and r.budget.host_ram_bytes > r.host_ram_bytes
    assert r.fails_at is FailsAt.HOST_RAM and r.to_dict()["fails_at"] == "host-ram"
    assert r.decision.verdict.word == "does not fit"


def test_a_fit_inside_the_margin_names_what_costs_nothing() -> None:
    """Qwen2.5-7B LoRA at 4 x 4096 on one RTX 4090: Liger's fused loss with checkpointing at micro-batch 4 fits only
    inside the margin (the 152k-word vocabulary's logits gone), and check says what costs nothing there (the
    allocator setting), beside the ladder's fix."""
    from oomlab.launch.display import render_check
    from oomlab.launch.user import user_launch
    from oomlab.pipeline.params import PARAMETERS, parse_params

    launch = user_launch(parse_params(["model=qwen2.5-7b", "gpu=rtx-4090", "gpus=1", "method=lora",
                                       "precision=bf16-mixed", "batch=4", "seq=4096"]),
                         {name: p.default for name, p in PARAMETERS.items()})
    r = check_launch(LaunchInputs(gpu="rtx-4090"), launch=launch)
    assert r.decision.tight and r.decision.tight[-1].setup.batch == 4
    assert r.decision.tight[-1].setup.loss is Loss.LIGER_FLCE and r.decision.tight[-1].setup.checkpointing
    assert "inside the margin: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in render_check(r)
