"""LoRA over a base from_pretrained loaded in fp32 (BaseDtype.FP32: transformers 4.x without torch_dtype, TRL's
ModelConfig default): the frozen weights at 4 bytes, autocast's half copy of every frozen weight kept for backward,
an fp32 residual stream -- read from the user's launch, budgeted, and fixed by loading the base in half.

The hand-derived LLaMA inventory under it equals the one-layer trace of transformers' real layer
(tests/budget/test_layer_trace.py), and a real CPU step agrees (docs/small-scale-measured.md)."""

from __future__ import annotations

import pytest

from oomlab.budget import activations as act
from oomlab.budget import states
from oomlab.budget.api import estimate
from oomlab.budget.display import render_budget
from oomlab.core.choices import BaseDtype, Method
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.setup import make_setup
from oomlab.core.versions import versions_from
from oomlab.launch.check import check_launch
from oomlab.launch.read import LaunchInputs
from oomlab.launch.record import setup_of, setup_record
from oomlab.launch.resolve import read_launch
from oomlab.remedies.ladder import Rung

LORA = {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 1, "method": "lora", "precision": "bf16-mixed",
        "batch": 4, "seq": 512, "lora_targets": "q_proj,v_proj"}


def _pair(**knobs):
    half = make_setup(**{**LORA, **knobs})
    return half, half.with_(base_dtype="float32")


def test_default_is_half_and_the_field_is_typed() -> None:
    assert make_setup(**LORA).base_dtype is BaseDtype.HALF
    assert make_setup(**LORA, base_dtype="float32").base_dtype is BaseDtype.FP32
    with pytest.raises(UnknownNameError, match="unknown base dtype 'fp32'.*float32, half"):
        make_setup(**LORA, base_dtype="fp32")


def test_pure_half_refuses_an_fp32_base() -> None:
    """Pure half precision stores every weight in half: an fp32-loaded model under autocast is the mixed one."""
    with pytest.raises(InvalidValueError, match="base dtype 'float32' with precision 'bf16'.*bf16-mixed"):
        make_setup(**{**LORA, "precision": "bf16"}, base_dtype="float32")


def test_frozen_weights_take_four_bytes() -> None:
    half, fp32 = _pair()
    n, adapters = half.model.num_parameters, 4 * states.lora_parameters(half)
    assert states.weight_bytes_total(half) == 2 * n + adapters
    assert states.weight_bytes_total(fp32) == 4 * n + adapters


def test_autocast_keeps_a_half_copy_of_every_frozen_weight_past_the_first_adapter() -> None:
    """Without checkpointing: each later layer's projections and the head (their inputs need a gradient); in the
    first layer only what follows its first adapter (o_proj, the MLP)."""
    half, fp32 = _pair()
    spec = fp32.model
    dims = spec.projection_shapes
    layer = sum(i * o for i, o in dims.values())
    first = layer - sum(dims[m][0] * dims[m][1] for m in ("q_proj", "k_proj", "v_proj"))
    head = spec.vocab_size * spec.hidden_size
    expected = 2 * (first + (spec.num_hidden_layers - 1) * layer + head)
    # over what LoRA keeps anyway (autocast's half copies of the adapters)
    assert act.autocast_copy_bytes(fp32) - act.autocast_copy_bytes(half) == expected
    # with checkpointing: the head's copy, and the recomputed layer's copies in its backward
    ckpt = fp32.with_(checkpointing=True)
    assert act.autocast_copy_bytes(ckpt) - act.autocast_copy_bytes(half.with_(checkpointing=True)) == 2 * head
    assert act.layer_fixed_bytes(ckpt) >= 2 * layer


def test_the_stream_is_fp32_and_the_saved_bytes_per_token_are_lora_s() -> None:
    """The fp32 stream is what the norms save either way (their fp32 input), so per token LoRA saves the same."""
    half, fp32 = _pair()
    assert (act.stream_bytes(half), act.stream_bytes(fp32)) == (2, 4)
    assert act.layer_activation_bytes(fp32) == act.layer_activation_bytes(half)
    assert act.checkpoint_layer_bytes(fp32.with_(checkpointing=True)) == 2 * act.checkpoint_layer_bytes(
        half.with_(checkpointing=True))


@pytest.mark.parametrize("knobs", [{"strategy": "zero2", "gpus": 2}, {"method": "full"}])
def test_where_it_changes_nothing(knobs: dict) -> None:
    """DeepSpeed casts every parameter to half; full fine-tuning's weights follow the precision."""
    half, fp32 = _pair(**knobs)
    assert estimate(**{**LORA, **knobs}).per_gpu_peak_bytes == estimate(
        **{**LORA, **knobs}, base_dtype="float32").per_gpu_peak_bytes
    assert not states.fp32_loaded_base(fp32) and not act.fp32_base(fp32)


def test_the_budget_says_so() -> None:
    result = estimate(**LORA, base_dtype="float32")
    assert "base loaded in float32" in render_budget(result)
    assert any("frozen base kept in fp32 as from_pretrained loaded it" in note for note in result.notes)
    assert result.to_dict()["base_dtype"] == "float32"
    assert result.per_gpu_peak_bytes > estimate(**LORA).per_gpu_peak_bytes + 2 * result.setup.model.num_parameters


def test_the_setup_record_keeps_it() -> None:
    _, fp32 = _pair()
    assert setup_of(setup_record(fp32)).base_dtype is BaseDtype.FP32
    record = setup_record(fp32)
    del record["base_dtype"]  # a record written before the field: half, as budgeted then
    assert setup_of(record).base_dtype is BaseDtype.HALF


@pytest.mark.parametrize(("versions", "expected", "origin"), [
    ("transformers==4.31.0", BaseDtype.FP32, "default of transformers 4.31.0"),
    ("transformers==5.2.0", BaseDtype.HALF, "assumed: no torch_dtype in the launch or the model's config.json"),
])
def test_a_lora_launch_without_torch_dtype_by_transformers_release(tmp_path, versions, expected, origin) -> None:
    """A Trainer script with --bf16 over a LoRA adapter config and no torch_dtype: fp32 in 4.x (from_pretrained's
    torch.float), the checkpoint's half in 5.x (dtype='auto')."""
    adapter = tmp_path / "adapter_config.json"
    adapter.write_text('{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}')
    launch = read_launch(LaunchInputs(command="python train.py --bf16 --per_device_train_batch_size 1",
                                      adapter_config=str(adapter), model="llama-2-7b", gpu="a100-80gb", gpus=1,
                                      versions=versions_from(versions)))
    assert launch.setup.method is Method.LORA
    assert launch.setup.base_dtype is expected
    assert str(launch.fields["base_dtype"].origin).startswith(origin)


def test_trl_default_float32_is_fixed_by_loading_in_half() -> None:
    """TRL's scripts load ModelConfig.dtype ('float32' by default): a LoRA run that does not fit in fp32 but does in
    half gets the free rung first, spelled --dtype bfloat16 in its command."""
    launch = read_launch(LaunchInputs(
        command="trl sft --model_name_or_path meta-llama/Llama-2-7b-hf --use_peft --per_device_train_batch_size 1 "
                "--max_length 512 --bf16",
        model="llama-2-7b", gpu="a10g", gpus=1))
    assert launch.setup.base_dtype is BaseDtype.FP32
    assert "ModelConfig dtype='float32'" in str(launch.fields["base_dtype"].origin)
    result = check_launch(LaunchInputs(gpu="a10g"), launch=launch)
    steps = result.decision.steps
    assert steps and steps[0].rung is Rung.HALF_BASE, result.decision.tried
    assert result.decision.setup.base_dtype is BaseDtype.HALF
    assert "--dtype bfloat16" in result.smallest_fix.launch
    assert result.smallest_fix.how[0].startswith("base_dtype bfloat16: --dtype bfloat16")


def test_the_pipeline_s_dtype_parameter_sets_it() -> None:
    """-p dtype=float32 under LoRA with a mixed precision: the base is budgeted in fp32, its origin the parameter;
    the default dtype (the seed's float16) keeps it half."""
    from oomlab.launch.user import user_launch
    from oomlab.pipeline.params import PARAMETERS, parse_params

    defaults = {name: p.default for name, p in PARAMETERS.items()}
    lora = ["method=lora", "precision=fp16-mixed", "gpus=1"]
    given = user_launch(parse_params([*lora, "dtype=float32"]), defaults)
    assert given.setup.base_dtype is BaseDtype.FP32
    assert str(given.fields["base_dtype"].origin) == "flag -p dtype=float32"
    assert user_launch(parse_params(lora), defaults).setup.base_dtype is BaseDtype.HALF
    assert "base_dtype" not in user_launch(parse_params(["gpus=1", "dtype=float32"]), defaults).fields  # full


def test_the_knob_table_keeps_the_run_s_load_loop_and_stack() -> None:
    """Each single change keeps the configured base dtype, trainer and versions (it budgeted SFT over a half base
    before); a change to pure half loads the base in it."""
    from oomlab.remedies.knobs import knob_table

    _, fp32 = _pair()
    base = fp32.with_(trainer="dpo", versions={"transformers": "4.46.0"})
    rows = [r for r in knob_table(base, 64 * 2**30) if r.setup is not None]
    assert rows
    for row in rows:
        assert (row.setup.trainer.value, row.setup.versions) == ("dpo", base.versions), row.changes
        pure = row.setup.precision.value in ("bf16", "fp16")
        assert row.setup.base_dtype is (BaseDtype.HALF if pure else BaseDtype.FP32), row.changes


def test_a_full_run_loaded_in_fp32_switched_to_lora_loads_the_base_in_half(tmp_path) -> None:
    """A Trainer script without torch_dtype (transformers 4.46: fp32) whose fix is LoRA: the LoRA rung loads the
    base in half and says where; the full run's base dtype travels with its setup (it changes no full budget)."""
    launch = read_launch(LaunchInputs(command="python train.py --bf16 --per_device_train_batch_size 4 "
                                              "--gradient_checkpointing --max_seq_length 4096",
                                      model="llama-3.1-8b", gpu="a100-40gb", gpus=1,
                                      versions=versions_from("transformers==4.46.0")))
    assert launch.setup.base_dtype is BaseDtype.FP32 and "base_dtype" not in launch.fields
    assert estimate(model="llama-3.1-8b", gpu="a100-40gb", gpus=1, precision="bf16-mixed",
                    base_dtype="float32").per_gpu_peak_bytes == estimate(
        model="llama-3.1-8b", gpu="a100-40gb", gpus=1, precision="bf16-mixed").per_gpu_peak_bytes
    result = check_launch(LaunchInputs(gpu="a100-40gb"), launch=launch)
    fixed = result.decision.setup
    assert fixed is not None and fixed.method is not Method.FULL, result.decision.tried
    assert fixed.base_dtype is BaseDtype.HALF
    method_how = next(h for h in result.smallest_fix.how if h.startswith("method"))
    assert "the base loaded in bfloat16 (from_pretrained(..., torch_dtype=torch.bfloat16) in the script)" in method_how


@pytest.mark.parametrize(("trl", "claim", "flag"), [("0.19.0", False, "--torch_dtype"), ("0.21.0", False, "--dtype"),
                                                    ("1.0.0", True, "--dtype")])
def test_trl_s_load_dtype_by_release(trl: str, claim: bool, flag: str) -> None:
    """ModelConfig's load dtype: torch_dtype before TRL 0.21, dtype after; float32 by default from PR #4778 (taken
    from 1.0.0), None before (from_pretrained's own default: fp32 under transformers 4.x, half under 5.x)."""
    from oomlab.launch.check import _load_dtype_flag

    launch = read_launch(LaunchInputs(
        command="trl sft --model_name_or_path meta-llama/Llama-2-7b-hf --use_peft --bf16", model="llama-2-7b",
        gpu="a100-80gb", gpus=1, versions=versions_from(f"trl=={trl},transformers==5.2.0")))
    said = "ModelConfig dtype='float32'" in str(launch.fields["load_dtype"].origin)
    assert said is claim
    assert launch.setup.base_dtype is (BaseDtype.FP32 if claim else BaseDtype.HALF)
    assert _load_dtype_flag(launch) == flag
