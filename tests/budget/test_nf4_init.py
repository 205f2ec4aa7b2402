"""torchtune < 0.2.0's QLoRA init on torchao 0.1 (oomlab.budget.nf4_init): when it applies, and what it adds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oomlab.budget import estimate
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory
from oomlab.core.units import GiB

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
