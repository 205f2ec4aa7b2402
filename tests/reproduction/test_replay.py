"""The seed's OOM, reproduced at full 13B size through torch's own Module._apply."""

import pytest
import torch

from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.seed import seed_figures
from oomlab.core.units import MiB, format_size
from oomlab.reproduction.outside import seed_outside_bytes
from oomlab.reproduction.replay import reproduce
from oomlab.reproduction.result import compare_with_seed
from oomlab.reproduction.summary import smallest_fitting_gpu, summarize
from oomlab.reproduction.walk import TensorKind, unlimited_walk


@pytest.fixture(scope="module")
def seed_result():
    return reproduce(device="simulated")


def test_seed_figures_parsed_from_report() -> None:
    """The packaged report's message yields the five figures the user saw."""
    figs = seed_figures()
    assert (figs.tried, figs.total, figs.allocated, figs.free, figs.reserved) == (
        "136.00 MiB", "14.75 GiB", "14.16 GiB", "40.81 MiB", "14.16 GiB")


def test_reproduced_message_matches_every_seed_figure(seed_result) -> None:
    """Tried 136.00 MiB; 14.75 GiB total; 14.16 GiB allocated; 40.81 MiB free; 14.16 GiB reserved."""
    assert seed_result.raised and seed_result.exception == "torch.OutOfMemoryError"
    rows = compare_with_seed(seed_result)
    assert [r.reproduced for r in rows] == ["136.00 MiB", "14.75 GiB", "14.16 GiB", "40.81 MiB", "14.16 GiB"]
    assert all(r.matches for r in rows)
    assert seed_result.message.startswith(
        "CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; 14.16 GiB already "
        "allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch)")


def test_failing_tensor_is_layer_23_gate_proj(seed_result) -> None:
    """The copy that fails is the 5120 x 13824 fp16 MLP gate projection of layer 23 (0-based), 58% in."""
    ft = seed_result.failing_tensor
    assert (ft.name, ft.shape, ft.dtype, ft.nbytes) == (
        "model.layers.23.mlp.gate_proj.weight", (13824, 5120), "float16", 141557760)
    assert 0.58 < seed_result.moved_fraction < 0.59
    assert format_size(seed_result.model_bytes) == "24.24 GiB"
    assert seed_result.fits is False


def test_moved_tensors_are_told_by_kind(seed_result) -> None:
    """Each copy is a parameter or a buffer, as a TensorKind; the JSON carries the kind's name."""
    steps = unlimited_walk("llama-13b", "float16")
    assert {s.kind for s in steps} <= {TensorKind.PARAMETER, TensorKind.BUFFER}
    assert steps[0].kind is TensorKind.PARAMETER and seed_result.failing_tensor.kind is TensorKind.PARAMETER
    data = seed_result.to_dict(include_steps=True)
    assert data["failing_tensor"]["kind"] == "parameter" and data["steps"][0]["kind"] == "parameter"


def test_traceback_passes_through_module_apply_and_convert(seed_result) -> None:
    """The exception is raised with torch/nn/modules/module.py's _apply and convert on the stack."""
    torch_frames = [name for path, _, name in seed_result.traceback if path.endswith("torch/nn/modules/module.py")]
    assert "_apply" in torch_frames and "convert" in torch_frames and "to" in torch_frames
    assert seed_result.frames.index("_apply") < seed_result.frames.index("convert")


def test_outside_memory_derived_from_seed() -> None:
    """Outside PyTorch = total - reserved - free of the seed: a CUDA-context-sized 561 MiB."""
    assert format_size(seed_outside_bytes()) == "561.00 MiB"


def test_moved_parameters_report_cuda() -> None:
    """After a walk that fits, the model's parameters report cuda:0 (fake CUDA tensors)."""
    from oomlab.core.dtypes import load_dtype
    from oomlab.core.models import load_model
    from oomlab.reproduction.allocator import CachingAllocator
    from oomlab.reproduction.traced_walk import walk_apply

    mode, model, error = walk_apply(load_model("llama-7b"), load_dtype("float16"), CachingAllocator(1 << 40))
    assert error is None
    assert {str(p.device) for p in model.parameters()} == {"cuda:0"}
    assert len(mode.steps) == len(list(model.parameters())) + len(list(model.buffers()))


def test_fp32_fails_earlier_with_270_mib() -> None:
    """In float32 the same projection asks for 270 MiB, and the walk fails far earlier."""
    result = reproduce(dtype="float32", device="simulated")
    assert format_size(result.tried_bytes) == "270.00 MiB"
    assert result.moved_fraction < 0.3


def test_case_that_fits() -> None:
    """llama-7b in fp16 fits one T4: no exception, everything moved."""
    result = reproduce(model="llama-7b", device="simulated")
    assert not result.raised and result.fits and result.failing_tensor is None
    assert result.moved_parameters == result.model_parameters
    assert "succeeded" in summarize(result)


def test_smallest_fitting_gpu_for_13b_fp16() -> None:
    """llama-13b fp16 first fits a 32 GB V100 among the shipped GPUs."""
    assert smallest_fitting_gpu("llama-13b", "float16", seed_outside_bytes()) == "v100-32gb"


def test_unlimited_walk_reserves_at_least_the_tensors() -> None:
    """The allocator reserves no less than the tensor bytes, and rounding adds under 1 %."""
    steps = unlimited_walk("llama-13b", "float16")
    assert steps[-1].moved_bytes <= steps[-1].reserved_bytes < 1.01 * steps[-1].moved_bytes


def test_new_message_format() -> None:
    """The torch>=2.1 format carries the same figures."""
    result = reproduce(device="simulated", message_format="torch>=2.1")
    assert "GPU 0 has a total capacity of 14.75 GiB of which 40.81 MiB is free" in result.message


def test_non_pytorch_memory_changes_the_failure_point() -> None:
    """More memory held outside PyTorch makes the walk fail earlier."""
    result = reproduce(device="simulated", non_pytorch_mib=2048)
    assert result.moved_fraction < 0.53  # 0.58 with the seed's 561 MiB
    assert result.outside_pytorch_bytes == 2048 * MiB


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model": "gpt-5"}, UnknownNameError, "unknown model 'gpt-5'; known: falcon-7b, gemma-2-27b"),
        ({"gpu": "k80"}, UnknownNameError, "unknown GPU 'k80'; known: a100-40gb"),
        ({"dtype": "int4"}, UnknownNameError, "unknown dtype 'int4'"),
        ({"device": "tpu"}, UnknownNameError, "unknown device 'tpu'; known: auto, cuda, simulated"),
        ({"non_pytorch_mib": -1}, InvalidValueError, "invalid non-PyTorch memory -1 MiB"),
        ({"non_pytorch_mib": 10**6}, InvalidValueError, "below the t4 capacity of 15101.81 MiB"),
    ],
)
def test_bad_input_is_refused_before_work(kwargs, error, match) -> None:
    """Bad input names the value and the accepted ones."""
    with pytest.raises(error, match=match):
        reproduce(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is absent")
def test_cuda_device_without_cuda() -> None:
    """--device cuda without a GPU is a clear input error."""
    from oomlab.core.errors import OomlabError

    with pytest.raises(OomlabError, match="device 'cuda' needs a CUDA GPU"):
        reproduce(device="cuda")
