"""The HF Trainer's defaults at the user's transformers release (issue 24): the default optim (adamw_hf before 4.32,
adamw_torch before 4.54, adamw_torch_fused after under torch >= 2.8), the attention (eager before 4.36's SDPA), each
origin naming the release; transformers' own AdamW budgeted as the loop it is."""

from __future__ import annotations

import pytest

from oomlab.budget import states
from oomlab.core.choices import Attention, Optimizer
from oomlab.core.setup import make_setup
from oomlab.core.versions import versions_from
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch

COMMAND = "python train.py --bf16 --per_device_train_batch_size 1 --gradient_checkpointing"


@pytest.mark.parametrize(("versions", "optimizer", "attention"), [
    ("transformers==4.31.0", Optimizer.ADAMW_HF, Attention.EAGER),
    ("transformers==4.35.2", Optimizer.ADAMW, Attention.EAGER),
    ("transformers==4.36.0", Optimizer.ADAMW, Attention.SDPA),
    ("transformers==4.54.0,torch==2.7.1", Optimizer.ADAMW, Attention.SDPA),
    ("transformers==4.54.0,torch==2.8.0", Optimizer.ADAMW_FUSED, Attention.SDPA),
])
def test_the_trainer_defaults_follow_the_release(versions: str, optimizer: Optimizer, attention: Attention) -> None:
    launch = read_launch(LaunchInputs(command=COMMAND, model="llama-2-7b", gpu="a100-80gb", gpus=1,
                                      versions=versions_from(versions)))
    release = versions.split(",")[0].split("==")[1]
    assert launch.setup.optimizer is optimizer and launch.setup.attention is attention
    for field in ("optimizer", "attention", "accumulation"):
        assert str(launch.fields[field].origin).startswith(f"default of transformers {release} (given)"), field


def test_the_installed_release_is_named_when_none_is_given() -> None:
    launch = read_launch(LaunchInputs(command=COMMAND, model="llama-2-7b", gpu="a100-80gb", gpus=1))
    assert str(launch.fields["optimizer"].origin).startswith("default of transformers 5.")


def test_adamw_hf_holds_one_tensor_s_moment() -> None:
    """transformers' AdamW loops over the parameters: the largest tensor's sqrt(exp_avg_sq), not the whole state's
    (torch's foreach AdamW); under DeepSpeed the flat partition is one tensor to it, as to foreach."""
    full = make_setup(model="llama-2-7b", gpu="a100-80gb", gpus=1, precision="bf16-mixed", optimizer="adamw-hf")
    spec = full.model
    assert states.optimizer_temp_bytes(full) == 4 * spec.embedding_params  # 32000 x 4096, the largest tensor
    assert states.optimizer_temp_bytes(full.with_(optimizer="adamw")) == states.optimizer_on_gpu(full) // 2
    lora = full.with_(method="lora", lora_targets=("q_proj", "v_proj"))
    assert states.optimizer_temp_bytes(lora) == 4 * lora.lora_rank * spec.hidden_size
    fsdp = full.with_(gpus=4, strategy="fsdp")
    assert states.optimizer_temp_bytes(fsdp) == 4 * (2 * spec.embedding_params) // 4  # the root unit's shard
    from oomlab.budget.deepspeed import foreach_adamw
    from oomlab.budget.deepspeed_config import DeepSpeedSettings, OptimizerSource
    zero = full.with_(gpus=4, strategy="zero2")
    assert foreach_adamw(zero, DeepSpeedSettings(optimizer_source=OptimizerSource.TRAINER))


@pytest.mark.parametrize(("model", "before", "since"), [
    ("mistral-7b", "4.36.2", "4.37.0"),  # no MistralSdpaAttention in 4.36.0
    ("phi-2", "4.38.2", "4.39.0"),
    ("pythia-1.4b", "4.41.2", "4.42.0"),
    ("phi-3-mini-4k", "4.44.2", "4.45.0"),  # _supports_sdpa = False in 4.41-4.44
])
def test_each_family_gets_sdpa_at_its_own_release(model: str, before: str, since: str) -> None:
    """A family's first release with _supports_sdpa = True (the wheels' modeling files), not 4.36 for all."""
    def attention(release: str) -> Attention:
        return read_launch(LaunchInputs(command=COMMAND.replace("--bf16 ", ""), model=model, gpu="a100-80gb", gpus=1,
                                        versions=versions_from(f"transformers=={release}"))).setup.attention
    assert attention(before) is Attention.EAGER and attention(since) is Attention.SDPA
