"""Full fine-tuning trains in the dtype the launch loads the weights in, unless a sharded launcher makes an fp32 master:
--bf16 over a model loaded with torch_dtype=bfloat16 under DDP is pure bf16 (weights, gradients, AdamW moments), under
FSDP (accelerate upcasts) or DeepSpeed it is mixed; an fp16 model under --fp16 meets the GradScaler's refusal."""

from __future__ import annotations

import pytest

from oomlab.budget.result import MemCategory, Phase
from oomlab.core.choices import Precision
from oomlab.launch.check import check_launch
from oomlab.launch.read import LaunchInputs
from oomlab.launch.trained_dtype import FP16_SCALER_REFUSES

RUN = ("torchrun --nproc_per_node 8 train.py --model_name_or_path meta-llama/Llama-3.1-8B {flags} "
       "--per_device_train_batch_size 1 --max_seq_length 2048 --gradient_checkpointing")


def _check(flags: str):
    return check_launch(LaunchInputs(command=RUN.format(flags=flags), model="llama-3.1-8b", gpu="a100-80gb"))


def test_bf16_loaded_weights_under_ddp_train_in_bf16() -> None:
    mixed, pure = _check("--bf16"), _check("--bf16 --torch_dtype bfloat16")
    assert mixed.launch.setup.precision is Precision.BF16_MIXED
    assert pure.launch.setup.precision is Precision.BF16
    origin = str(pure.launch.fields["precision"].origin)
    assert "loaded in bfloat16 (flag --torch_dtype bfloat16)" in origin and "nothing makes an fp32 master" in origin
    # half the weights, gradients and moments of the fp32-master run
    steady = Phase.OPTIMIZER
    for part in (MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.OPTIMIZER_STATE):
        assert pure.budget.phases[steady][part] * 2 == mixed.budget.phases[steady][part], part


def test_fsdp_keeps_its_fp32_master() -> None:
    r = _check("--bf16 --torch_dtype bfloat16 --fsdp 'full_shard auto_wrap'")
    assert r.launch.setup.precision is Precision.BF16_MIXED


def test_lora_and_an_assumed_load_dtype_change_nothing() -> None:
    assert _check("--bf16 --torch_dtype bfloat16 --use_peft --lora_r 16").launch.setup.precision is \
        Precision.BF16_MIXED


@pytest.mark.parametrize("flags", ["--fp16 --torch_dtype float16"])
def test_fp16_weights_under_fp16_meet_the_grad_scaler(flags: str) -> None:
    r = _check(flags)
    assert r.launch.setup.precision is Precision.FP16
    assert any(u.why == FP16_SCALER_REFUSES for u in r.launch.unmodelled)
