"""Loading at the user's transformers release (issue 24): the default load dtype, a 4-bit base's load peak as
bitsandbytes quantizes it on arrival, and each node's host RAM while its processes load."""

from pathlib import Path

import pytest

from oomlab.core.choices import Method, Precision
from oomlab.core.gpus import load_gpu
from oomlab.core.models import load_model
from oomlab.core.versions import parse_versions
from oomlab.launch.check import FailsAt, check_launch
from oomlab.launch.display import verdict
from oomlab.launch.load_peak import SHARD_BYTES
from oomlab.launch.origin import OriginKind
from oomlab.launch.paths import LoadPath
from oomlab.launch.read import LaunchInputs
from oomlab.reproduction.apply_walk import move_replica
from oomlab.reproduction.outside import case_outside

TRAIN = "torchrun --nproc_per_node {n} train.py --per_device_train_batch_size 1 --bf16 --gradient_checkpointing"
OLD = parse_versions("transformers==4.40.0")
NEW = parse_versions("transformers==5.0.0")


def _check(model: str, gpu: str, versions, n: int = 1, extra: str = "", host_ram=None, where=None):
    return check_launch(LaunchInputs(command=TRAIN.format(n=n) + extra, model=model, gpu=gpu, versions=versions,
                                     command_dir=None if where is None else str(where)), host_ram=host_ram)


def test_transformers_4_without_torch_dtype_loads_fp32_and_the_replica_doubles() -> None:
    """Qwen2.5-7B's config says bfloat16, but transformers 4.40 without torch_dtype loads float32: the Trainer's
    .to() moves an fp32 replica (twice the bf16 one), and the field's origin names the release and the code."""
    old, new = _check("qwen2.5-7b", "a100-80gb", OLD), _check("qwen2.5-7b", "a100-80gb", NEW)
    assert old.launch.setup.versions.release("transformers") == (4, 40, 0)  # --versions reaches the setup
    field = old.launch.fields["load_dtype"]
    assert field.value == "float32" and field.origin.kind is OriginKind.DEFAULT
    assert "transformers 4.40.0 (given)" in str(field.origin) and "if torch_dtype is not None:" in str(field.origin)
    assert old.load.path is LoadPath.TRAINER_TO and "float32 replica" in old.load.detail
    fp32, bf16 = (move_replica("qwen2.5-7b", d, "a100-80gb") for d in ("float32", "bfloat16"))
    assert old.load.per_gpu_bytes == fp32.model_reserved_bytes + fp32.outside_pytorch_bytes
    assert new.load.per_gpu_bytes == bf16.model_reserved_bytes + bf16.outside_pytorch_bytes
    assert fp32.model_reserved_bytes == pytest.approx(2 * bf16.model_reserved_bytes, rel=0.01)
    # fp32 weights under --bf16 train mixed (an fp32 master); transformers 5's bf16 load trains in pure bf16
    assert old.launch.setup.precision is Precision.BF16_MIXED and new.launch.setup.precision is Precision.BF16


def test_transformers_5_loads_the_config_dtype() -> None:
    """5.x dtype='auto': the config's torch_dtype decides -- bfloat16 for Qwen2.5-7B, float32 for OLMo-2-13B -- and
    a config without one is an assumption, said so."""
    qwen = _check("qwen2.5-7b", "a100-80gb", NEW).launch.fields["load_dtype"]
    assert qwen.value == "bfloat16" and "dtype='auto'" in str(qwen.origin) and "4186-4187" in str(qwen.origin)
    olmo = _check("olmo-2-13b", "h100-80gb", NEW).launch.fields["load_dtype"]
    assert olmo.value == "float32" and "the checkpoint's float32" in str(olmo.origin)
    bare = _check("llama-2-7b", "a100-80gb", NEW).launch.fields["load_dtype"]
    assert bare.value == "bfloat16" and bare.origin.kind is OriginKind.ASSUMED
    # 4.x with a bitsandbytes base: the quantizer's float16, not fp32
    q = _check("qwen2.5-7b", "a100-80gb", OLD, extra=" --use_peft --load_in_4bit").launch.fields["load_dtype"]
    assert q.value == "float16" and "update_torch_dtype" in str(q.origin)


def test_qlora_70b_load_is_checked_with_the_per_tensor_transient() -> None:
    """Llama-2-70B QLoRA on one 48 GB RTX A6000: the load holds the 4-bit weights, the unquantized embedding, norms
    and head in bfloat16, and the largest projection's (gate/up, 8192 x 28672) bf16 copy plus its fp32 absmax while
    Params4bit._quantize runs -- it fits; on a 24 GB RTX 4090 the same load does not."""
    r = _check("llama-2-70b", "rtx-a6000", NEW, extra=" --use_peft --load_in_4bit")
    assert r.launch.setup.method is Method.QLORA and r.load.path is LoadPath.QUANTIZED
    spec = load_model("llama-2-70b")
    quantized = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)  # every decoder layer's nn.Linear
    unquantized = spec.num_parameters - quantized
    transient = 2 * 8192 * 28672 + 4 * (8192 * 28672 // 64)
    outside = case_outside("llama-2-70b", load_gpu("rtx-a6000"), 1).total_bytes
    packed = round(quantized * 4.127 / 8) + 1092 * 80 * 7
    assert r.load.per_gpu_bytes == packed + 2 * unquantized + transient + outside
    assert r.load.fits and r.load.per_gpu_bytes < r.load.capacity_bytes and "Params4bit._quantize" in r.load.detail
    small = _check("llama-2-70b", "rtx-4090", NEW, extra=" --use_peft --load_in_4bit")
    assert not small.load.fits and small.fails_at is FailsAt.LOAD


def test_eight_processes_loading_13b_fp32_exceed_a_256_gib_node(tmp_path: Path) -> None:
    """DDP × 8 of LLaMA-13B on transformers 4.40: each process builds the model in fp32 on the host and reads a
    full state dict of each shard beside it -- 8 × (52 GB + a 10 GB shard) > 256 GiB: check fails at load, on the
    host, and says so. transformers 5 (bf16, streamed) and ZeRO-3 under zero.Init (a 1/8 partition) fit."""
    r = _check("llama-13b", "a100-80gb", OLD, n=8, host_ram="256GiB")
    n = load_model("llama-13b").num_parameters
    assert r.load.host.processes == 8 and r.load.host_per_node_bytes == 8 * (4 * n + SHARD_BYTES)
    assert r.load.fits and r.fails_at is FailsAt.LOAD_HOST_RAM and r.phase is None
    assert "on the host" in verdict(r) and "256.00 GiB there" in verdict(r)
    assert r.to_dict()["load"]["host_per_node_bytes"] == r.load.host_per_node_bytes
    assert _check("llama-13b", "a100-80gb", NEW, n=8, host_ram="256GiB").fails_at is not FailsAt.LOAD_HOST_RAM
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    zero3 = _check("llama-13b", "a100-80gb", OLD, n=8, host_ram="256GiB", extra=" --deepspeed ds.json", where=tmp_path)
    assert zero3.load.path is LoadPath.ZERO_INIT and zero3.load.host_per_node_bytes < 256 * 2**30


def test_fsdp_loads_once_per_node_as_the_step_budget_says() -> None:
    """FSDP (cpu_ram_efficient_loading, as the step's host figure assumes): one process per node reads the model;
    a 4-bit base loads on every rank (transformers and accelerate skip the rank-0 path for quantized models)."""
    r = _check("llama-13b", "a100-80gb", OLD, n=8, extra=" --fsdp 'full_shard auto_wrap'")
    assert r.load.path is LoadPath.FSDP2_SHARDS and r.load.host.processes == 1
    n = load_model("llama-13b").num_parameters
    assert r.load.host_per_node_bytes == 4 * n + SHARD_BYTES
    q = _check("llama-13b", "a100-80gb", OLD, n=8, extra=" --fsdp 'full_shard auto_wrap' --use_peft --load_in_4bit")
    assert q.load.host.processes == 8 and q.load.per_gpu_bytes is None  # sharded 4-bit: the step decides


def test_mixtral_qlora_load_follows_the_release() -> None:
    """Mixtral-8x7B QLoRA on one H100 80 GB: transformers 4.46 quantizes every expert's nn.Linear as it loads (about
    22 GiB of 4-bit weights, float16 from the bitsandbytes quantizer); 5.x stores the experts as 3-D parameters that
    bitsandbytes leaves in the config's bfloat16 -- 84 GiB unquantized: the load itself does not fit."""
    spec = load_model("mixtral-8x7b")
    experts = sum(layout.expert_params for layout in spec.layer_layouts)
    old = _check("mixtral-8x7b", "h100-80gb", OLD, extra=" --use_peft --load_in_4bit")
    new = _check("mixtral-8x7b", "h100-80gb", NEW, extra=" --use_peft --load_in_4bit")
    assert old.launch.load_dtype == "float16" and new.launch.load_dtype == "bfloat16"
    assert old.load.fits and old.fails_at is not FailsAt.LOAD
    assert not new.load.fits and new.fails_at is FailsAt.LOAD
    assert new.load.per_gpu_bytes - old.load.per_gpu_bytes > 2 * experts - round(experts * 4.127 / 8) - 2**30
