"""The floors the hardware search skips candidates by: never above the budget, for every candidate of its grid on every
GPU type (several models, every method), and the lookup itself."""

import pytest

from oomlab.budget.estimator import estimate_setup
from oomlab.core.choices import Method, Precision, Strategy
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.models import load_model
from oomlab.core.setup import make_setup
from oomlab.remedies.peak_floor import Floor, PeakFloors
from oomlab.remedies.plan import plan_grid


def _grid(model: str, gpu: str, gpus: int, nodes: int, batch: int) -> list:
    """The search's candidates on one hardware option (what :func:`best_on` may budget), at micro-batch ``batch``."""
    return [c.setup for c in plan_grid(load_model(model), load_gpu(gpu), gpus, nodes, batch=batch, seq=2048,
                                       attention="sdpa", lora_rank=8) if c.may_recommend]


@pytest.mark.heavy  # about 40k analytic budgets
@pytest.mark.parametrize(("model", "gpus", "nodes"), [
    ("llama-2-70b", 1, 1),  # full, LoRA and QLoRA; one GPU: no multi-GPU strategy
    ("llama-2-70b", 8, 1),  # every strategy, DeepSpeed's offloads included
    ("qwen2.5-0.5b", 2, 1),  # tied embeddings: the tied gradient's backward candidate
    ("gemma-2-9b", 4, 1),  # eager attention only, a soft-capped head
    ("qwen3-30b-a3b", 8, 2),  # experts (MoE), two nodes
])
def test_floor_never_exceeds_the_budget(model: str, gpus: int, nodes: int) -> None:
    """For every GPU type g and every other GPU type h, each candidate's floor on g from its twin budgeted on h is no
    more than its budget on g, per GPU and on the host, at the micro-batches the search budgets (1 to its cap 8)."""
    budgets = {g: {b: [(s, estimate_setup(s)) for s in _grid(model, g, gpus, nodes, b)] for b in (1, 2, 8)}
               for g in known_gpus()}
    checked = 0
    for g, by_batch in budgets.items():
        for h in budgets:
            if h == g:
                continue
            floors = PeakFloors()
            for b in by_batch:
                for s, result in by_batch[b]:  # g's own first: its outside figure ...
                    floors.record(s, result)
                for s, result in budgets[h][b]:  # ... then h's, which replace each twin g shares with h
                    floors.record(s, result)
            for b, rows in by_batch.items():
                shared = {(s.strategy, s.method, s.precision, s.optimizer, s.checkpointing) for s, _ in budgets[h][b]}
                for s, result in rows:
                    if (s.strategy, s.method, s.precision, s.optimizer, s.checkpointing) not in shared:
                        continue  # bf16 on h but not g: no twin
                    floor = floors.floor(s)
                    assert floor is not None
                    assert floor.peak_bytes <= result.per_gpu_peak_bytes, (g, h, s)
                    assert floor.host_ram_bytes <= result.host_ram_bytes, (g, h, s)
                    checked += 1
    assert checked > 1000


def test_floor_is_the_twins_budget_with_this_gpus_outside() -> None:
    """A twin budgeted on an A100 gives a T4's floor: its peak less its outside-PyTorch memory, plus the T4's; the
    host RAM as is; a micro-batch never budgeted, or a GPU with nothing budgeted yet, has no floor."""
    a100 = make_setup(model="llama-2-7b", gpu="a100-80gb", gpus=2, strategy=Strategy.FSDP2, method=Method.LORA,
                      precision=Precision.FP16_MIXED)
    t4 = make_setup(model="llama-2-7b", gpu="t4", gpus=2, strategy=Strategy.FSDP2, method=Method.LORA,
                    precision=Precision.FP16_MIXED)
    on_a100, on_t4 = estimate_setup(a100), estimate_setup(t4)
    floors = PeakFloors()
    floors.record(a100, on_a100)
    assert floors.floor(t4) is None  # nothing budgeted on a T4 yet: its outside figure is unknown
    floors.record(t4.with_(checkpointing=True), estimate_setup(t4.with_(checkpointing=True)))
    floor = floors.floor(t4)
    assert floor == Floor(on_t4.per_gpu_peak_bytes, on_t4.host_ram_bytes)  # today's budget: exactly the T4's own
    assert floors.floor(t4, batch=4) is None
    assert floor.fits(t4.gpu, on_t4.host_ram_bytes) is on_t4.fits
    assert not floor.fits(t4.gpu, on_t4.host_ram_bytes - 1)
