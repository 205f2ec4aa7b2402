"""torchtune < 0.2.0's QLoRA init on torchao 0.1 (oomlab.budget.nf4_init): when it applies, and what it adds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oomlab.budget import estimate
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory
from oomlab.core.models import load_model
from oomlab.core.units import GiB, format_size

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _qlora(versions: dict, gpu: str = "a100-80gb", targets: tuple[str, ...] = ALL, method: str = "qlora"):
    return estimate("llama-2-7b", gpu=gpu, gpus=1, method=method, precision="bf16", batch=2, seq=512,
                    checkpointing=True, lora_targets=targets, versions=versions)


@pytest.mark.parametrize("versions", [{"torchtune": "0.2.0"}, {"torchtune": "0.4.0"},
                                      {"torchtune": "0.1.0", "torchao": "0.2.0"}, {"transformers": "4.40.0"}])
def test_no_load_term_off_torchao_0_1(versions) -> None:
    """Chunked quantization (torchao >= 0.2.0, torchtune >= 0.2.0 pins it) and HF's bitsandbytes path: no term."""
    assert _qlora(versions).load is None


def test_lora_has_no_load_term() -> None:
    assert _qlora({"torchtune": "0.1.0"}, method="lora").load is None


def test_torchtune_0_1_qlora_init_sets_the_reserved_figure() -> None:
    """The init holds the weights placed so far and one weight's unchunked quantization (64 bytes per element of
    the largest, 11008 x 4096); what it reserves stays cached, and the reserved figure reads it."""
    r = _qlora({"torchtune": "0.1.0"})
    weights = r.components[MemCategory.WEIGHTS]
    assert r.load is not None and r.loading_peaks
    assert r.load.allocated_peak_bytes >= weights + 64 * 11008 * 4096
    assert r.load.reserved_bytes >= r.load.allocated_peak_bytes
    assert r.reserved_peak_bytes == r.load.reserved_bytes > r.step_allocated_peak_bytes
    assert r.allocated_peak_bytes == r.load.allocated_peak_bytes
    assert r.per_gpu_peak_bytes == r.load.need_bytes
    assert any(note.startswith("loading: torchtune's QLoRA init on torchao 0.1") for note in r.notes)
    assert r.to_dict()["load"]["need_bytes"] == r.load.need_bytes


def test_a_gpu_below_the_init_need_does_not_fit() -> None:
    """On a GPU the step alone fits but the init does not (9 GiB here), the verdict is the init's: out of memory
    while loading, short by its need; the same setup on the A100 fits."""
    roomy = _qlora({"torchtune": "0.1.0"})
    assert roomy.fits and roomy.load.need_bytes <= roomy.capacity_bytes
    setup = roomy.setup
    small = replace(setup, gpu=replace(setup.gpu, total_memory_bytes=9 * GiB))
    r = estimate_setup(small)
    assert sum(r.components.values()) < 9 * GiB < r.load.need_bytes
    assert not r.fits and r.headroom_bytes == 9 * GiB - r.load.need_bytes
    assert any("out of memory while loading on this GPU" in note for note in r.notes)


def test_torchtune_before_0_3_keeps_unadapted_projections_in_bf16() -> None:
    """Before FrozenNF4Linear (torchtune 0.3.0) only the adapted projections are NF4: q,v adapters leave k, o and
    the MLP in bf16."""
    old = _qlora({"torchtune": "0.2.1"}, targets=("q_proj", "v_proj")).components[MemCategory.WEIGHTS]
    new = _qlora({"torchtune": "0.3.0"}, targets=("q_proj", "v_proj")).components[MemCategory.WEIGHTS]
    unadapted = 32 * (2 * 4096 * 4096 + 3 * 4096 * 11008)  # k, o and the MLP, per layer
    assert old - new == pytest.approx(unadapted * (2 - 0.5), rel=0.02)
    every = _qlora({"torchtune": "0.2.1"}).components[MemCategory.WEIGHTS]
    assert every == _qlora({"torchtune": "0.3.0"}).components[MemCategory.WEIGHTS]


def test_the_init_figures_do_not_depend_on_the_gpu_and_an_oom_says_its_shortfall() -> None:
    """The allocated peak is the init's whatever the GPU (not cut at a failure); out of memory while loading, the
    shortfall said is the need's, as the verdict's."""
    roomy = _qlora({"torchtune": "0.1.0"})
    small = estimate_setup(replace(roomy.setup, gpu=replace(roomy.setup.gpu, total_memory_bytes=8 * GiB)))
    assert small.load.allocated_peak_bytes == roomy.load.allocated_peak_bytes
    assert small.load.need_bytes == roomy.load.need_bytes > 8 * GiB
    assert small.allocated_peak_bytes >= small.load.allocated_peak_bytes
    assert any(format_size(small.load.need_bytes - 8 * GiB) + " short" in note for note in small.notes)
    assert small.headroom_bytes == 8 * GiB - small.load.need_bytes


def test_a_tied_head_is_not_a_second_matrix() -> None:
    """Llama-3.2-1B ties its head to the embedding: the init holds one (vocab x hidden) matrix; the same model
    untied holds a second, held from before the layers are built, so its peak is exactly that much higher."""
    from oomlab.budget import nf4_init

    spec = load_model("llama-3.2-1b")
    assert spec.tie_word_embeddings and spec.lm_head_params == 0
    untied = replace(spec, tie_word_embeddings=False)
    tied_peak = nf4_init._run(spec, ALL, 8, 1 << 50, 0).allocated_peak
    untied_peak = nf4_init._run(untied, ALL, 8, 1 << 50, 0).allocated_peak
    assert untied_peak - tied_peak == pytest.approx(2 * spec.embedding_params, abs=2 * 2**20)  # a segment's rounding


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": 2, "strategy": "fsdp"}, "runs QLoRA on one GPU only"),
    ({"precision": "fp16-mixed", "gpu": "a10g"}, "its recipe refuses fp16"),
    ({"model": "mixtral-8x7b"}, "a mixture of experts"),
])
def test_what_torchtune_0_1_qlora_cannot_run_is_refused(kwargs, message) -> None:
    from oomlab.core.errors import InvalidValueError

    args = {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 1, "method": "qlora", "precision": "bf16",
            "versions": {"torchtune": "0.1.0"}, **kwargs}
    with pytest.raises(InvalidValueError, match=message):
        estimate(**args)
    estimate(**{**args, "versions": {"torchtune": "0.2.0"}})  # the release that chunks runs them
