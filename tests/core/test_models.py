"""Model and GPU specs load from the shipped JSON; unknown names list the known ones."""

import json

import pytest
import torch

from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.modeling import build_meta_model
from oomlab.core.models import known_models, load_model
from oomlab.core.units import format_size

REQUIRED_MODELS = {"llama-7b", "llama-13b", "llama-30b", "llama-65b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
                   "llama-3.1-8b", "mistral-7b"}
REQUIRED_GPUS = {"t4", "v100-16gb", "v100-32gb", "a10g", "l4", "a100-40gb", "a100-80gb", "h100-80gb", "h200"}


def test_shipped_models_and_gpus() -> None:
    """Every model and GPU the issue names is shipped."""
    assert REQUIRED_MODELS <= set(known_models())
    assert REQUIRED_GPUS <= set(known_gpus())


def test_llama_13b_parameter_count() -> None:
    """llama-13b counts 13,015,864,320 parameters, from the shapes and from the meta-built model."""
    spec = load_model("llama-13b")
    model = build_meta_model(spec, load_dtype("float16"))
    assert spec.num_parameters == 13_015_864_320
    assert sum(p.numel() for p in model.parameters()) == 13_015_864_320
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize("name", sorted(REQUIRED_MODELS))
def test_analytic_count_matches_transformers(name: str) -> None:
    """The spec's parameter count equals the transformers model's, built on meta."""
    spec = load_model(name)
    model = build_meta_model(spec, load_dtype("bf16"))
    assert spec.num_parameters == sum(p.numel() for p in model.parameters())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_gqa_model_has_fewer_kv_heads() -> None:
    """llama-2-70b uses grouped-query attention with 8 KV heads."""
    spec = load_model("llama-2-70b")
    assert (spec.num_attention_heads, spec.num_key_value_heads) == (64, 8)
    assert spec.num_parameters == 68_976_648_192


def test_local_config_json(tmp_path) -> None:
    """A path to a config.json (or its folder) works like a shipped name."""
    config = dict(load_model("llama-7b").config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(str(tmp_path)).num_parameters == 6_738_415_616
    assert load_model(str(tmp_path / "config.json")).hidden_size == 4096


def test_local_config_missing_field(tmp_path) -> None:
    """A config.json without a needed field says which."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(InvalidValueError, match="lacks the field 'num_attention_heads'"):
        load_model(str(tmp_path / "config.json"))


def test_unknown_model_lists_known() -> None:
    """An unknown model name lists the shipped ones."""
    with pytest.raises(UnknownNameError, match=r"unknown model 'llama-14b'; known: llama-13b, llama-2-13b"):
        load_model("llama-14b")


def test_unknown_gpu_lists_known() -> None:
    """An unknown GPU lists the shipped ones."""
    with pytest.raises(UnknownNameError, match=r"^unknown GPU 'h9000'; known: a100-40gb, a100-80gb, a10g, "):
        load_gpu("h9000")


def test_unknown_dtype_lists_known() -> None:
    """An unknown dtype lists names and aliases."""
    with pytest.raises(UnknownNameError, match=r"unknown dtype 'int3'; known: .*float16"):
        load_dtype("int3")


def test_t4_as_torch_reports_it() -> None:
    """The T4: 15360 MiB in nvidia-smi, "14.75 GiB total capacity" in torch, sm_75, no bf16."""
    t4 = load_gpu("t4")
    assert format_size(t4.total_memory_bytes) == "14.75 GiB"
    assert t4.nvidia_smi_total_mib == 15360
    assert t4.compute_capability == (7, 5)
    assert t4.bf16 is False and t4.peak_bf16_flops is None


@pytest.mark.parametrize("name", sorted(REQUIRED_GPUS))
def test_gpu_specs_are_sourced_and_consistent(name: str) -> None:
    """Every figure cites a source; bf16 iff compute capability >= 8.0; torch sees less than nvidia-smi."""
    gpu = load_gpu(name)
    for key in ("total_memory_bytes", "nvidia_smi_total_mib", "compute_capability", "bf16", "peak_fp16_flops",
                "memory_bandwidth_bytes_per_s", "host_link"):
        assert gpu.sources.get(key), f"{name}: no source for {key}"
    assert gpu.bf16 == (gpu.compute_capability >= (8, 0))
    assert (gpu.peak_bf16_flops is None) == (not gpu.bf16)
    assert gpu.total_memory_bytes <= gpu.nvidia_smi_total_mib * 2**20
    assert gpu.peak_fp16_flops > gpu.peak_fp32_flops
