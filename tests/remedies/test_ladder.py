"""The ladder of least disruption (issue 22): the fix keeps what the user chose unless nothing else fits, needs
only the changes it names, keeps the margin, and calls a fit inside the margin "tight"."""

import json

import pytest

from oomlab.core.choices import Loss, Method, Strategy
from oomlab.core.prices import resolve_host_ram
from oomlab.core.setup import make_setup
from oomlab.remedies.ladder import KIND, Kind, Rung, climb
from oomlab.remedies.margin import MARGINS_JSON, margin_for
from oomlab.remedies.remedy import Evaluator


def _fix(**kw):
    setup = make_setup(**kw)
    return climb(setup, Evaluator(resolve_host_ram("auto", setup.gpu.name, setup.gpus).host_ram_bytes, None))


# four users: a LoRA run on one consumer GPU, full fine-tuning on FSDP and on DeepSpeed, MoE QLoRA
FOUR_USERS = {
    "lora on one A10G": dict(model="mistral-7b", gpu="a10g", gpus=1, method="lora", precision="bf16-mixed", batch=1,
                             seq=2048),
    "full FSDP, 8 x A100-40GB, micro-batch 8": dict(model="llama-3.1-8b", gpu="a100-40gb", gpus=8, strategy="fsdp",
                                                    precision="bf16-mixed", batch=8, seq=2048),
    "full ZeRO-2, 8 x V100-32GB": dict(model="llama-2-7b", gpu="v100-32gb", gpus=8, strategy="zero2",
                                       precision="fp16-mixed", batch=4, seq=2048),
    "MoE QLoRA, 4 x A100-80GB, 4 x 4096": dict(model="mixtral-8x7b", gpu="a100-80gb", gpus=4, strategy="fsdp",
                                               method="qlora", precision="bf16-mixed", batch=4, seq=4096),
}


@pytest.mark.parametrize("name", FOUR_USERS)
def test_the_fix_keeps_the_users_method_when_a_same_method_rung_fits(name: str) -> None:
    fix = _fix(**FOUR_USERS[name])
    assert fix.setup is not None, fix.tried
    assert fix.keeps_method and fix.fixed.fits
    assert all(KIND[s.rung] is not Kind.TRAINED for s in fix.steps)


def test_checkpointing_alone_when_it_fits() -> None:
    """LoRA on one A10G: checkpointing is the fix, nothing else changes (not QLoRA, not a shorter sequence)."""
    fix = _fix(**FOUR_USERS["lora on one A10G"])
    assert [s.rung for s in fix.steps] == [Rung.CHECKPOINTING]
    assert (fix.setup.method, fix.setup.batch, fix.setup.seq) == (Method.LORA, 1, 2048)


def test_micro_batch_down_keeps_the_global_batch() -> None:
    """70B LoRA at micro-batch 16 over 3 x 8 A100-40GB: micro-batch 1 with accumulation 16, sharded, checkpointed."""
    fix = _fix(model="llama-2-70b", gpu="a100-40gb", gpus=8, nodes=3, method="lora", precision="bf16-mixed",
               batch=16, seq=2048, strategy="ddp")
    assert fix.setup is not None and fix.setup.method is Method.LORA
    assert fix.setup.batch * fix.accumulation == 16
    assert fix.setup.strategy is Strategy.FSDP and fix.setup.checkpointing


def test_a_searched_rung_does_not_pay_for_a_dropped_change() -> None:
    """Qwen2.5-7B LoRA on one RTX 4090 at 4 x 4096: Liger's fused loss, checkpointing and micro-batch 2 stay in the
    fix whatever the last rung is (a shorter sequence instead of them would change the data more)."""
    fix = _fix(model="qwen2.5-7b", gpu="rtx-4090", gpus=1, method="lora", precision="bf16-mixed", batch=4,
               seq=4096)
    rungs = [s.rung for s in fix.steps]
    assert rungs == [Rung.FUSED_LOSS, Rung.CHECKPOINTING, Rung.MICRO_BATCH]
    assert fix.setup.loss is Loss.LIGER_FLCE and fix.setup.batch == 2 and fix.accumulation == 2


def test_a_fit_inside_the_margin_is_tight() -> None:
    """The peak fits the GPU but not with the class's margin: "tight", never "fits"."""
    fix = _fix(model="qwen2.5-7b", gpu="rtx-4090", gpus=1, method="lora", precision="bf16-mixed", batch=4,
               seq=4096)
    assert fix.tight and fix.tight[-1].setup.batch == 4 and fix.tight[-1].setup.loss is Loss.LIGER_FLCE
    tight = [v for r, v in fix.tried if v == "tight"]
    assert tight, fix.tried


def test_the_margins_come_from_the_published_evidence() -> None:
    """Each method's margin names the published row that sets it; full fine-tuning's is the PEFT benchmark's."""
    raw = json.loads(MARGINS_JSON.read_text())
    assert {m["method"] for m in raw["margins"]} == {m.value for m in Method}
    full = margin_for(make_setup(model="llama-2-7b", gpus=1))
    assert full.worst_row and full.worst_row.startswith("peft-metamathqa") and 0.05 < full.fraction < 0.2


def test_the_margins_file_is_current() -> None:
    """``python -m oomlab.evidence margins`` would write what is committed."""
    from oomlab.evidence.margins import margins_data, render

    assert render(margins_data()) == MARGINS_JSON.read_text()


def test_more_gpus_of_the_same_kind_before_changing_what_is_trained() -> None:
    """13B full fine-tuning, FSDP over 2 x A100-40GB with 64 GiB of host RAM (offload cannot hold the states): the
    fewest A100-40GBs that hold the shards, before LoRA; the global batch kept by less accumulation."""
    setup = make_setup(model="llama-2-13b", gpu="a100-40gb", gpus=2, strategy="fsdp", precision="bf16-mixed",
                       batch=1, seq=2048, checkpointing=True)
    fix = climb(setup, Evaluator(64 * 2**30, None))
    rungs = [s.rung for s in fix.steps]
    assert Rung.MORE_GPUS in rungs and fix.setup.method is Method.FULL, fix.tried
    assert fix.setup.gpus in (4, 8) and fix.setup.gpu.name == "a100-40gb"


def test_a_peak_set_while_loading_calibrates_no_step_margin_unless_the_load_is_budgeted() -> None:
    """torchtune's QLoRA tutorial row (9.13 GB reserved right after init, 9.29 GB in training) measured the load.
    oomlab budgets that load (torchao 0.1's unchunked NF4 under torchtune 0.1: BudgetResult.load), so the row
    calibrates the QLoRA margin like any other; without the load term it would be left out and named. A row without
    an after-init figure stays in."""
    from dataclasses import replace

    from oomlab.evidence.margins import margins_data, peak_set_at_load
    from oomlab.evidence.published import compare_all

    by_id = {c.row.id: c for c in compare_all()}
    tutorial = by_id["torchtune-tutorial-llama2-7b-qlora-r8"]
    assert tutorial.result.load is not None and not peak_set_at_load(tutorial)
    assert peak_set_at_load(replace(tutorial, result=replace(tutorial.result, load=None)))
    assert not peak_set_at_load(by_id["peft-metamathqa-2026-full"])
    qlora = next(m for m in margins_data()["margins"] if m["method"] == "qlora")
    assert "torchtune-tutorial-llama2-7b-qlora-r8" not in qlora["source"]


def test_an_approximated_row_calibrates_no_margin() -> None:
    """A trusted row that misses a first-order feature (torchtune's 8-bit row: the paged optimizer's state outside
    the torch counters) says what that feature is worth, not how far the estimate is off: left out, counted."""
    from oomlab.evidence.margins import margins_data
    from oomlab.evidence.published import compare_all
    from oomlab.evidence.published_rows import Coverage

    coverage = {c.row.id: c.row.coverage for c in compare_all()}
    for margin in margins_data()["margins"]:
        assert coverage[margin["worst_row"]] is Coverage.MODELLED, margin
    full = next(m for m in margins_data()["margins"] if m["method"] == "full")
    assert "approximated row" in full["source"] and full["worst_row"] != "torchtune-readme-flags-3b-adamw8bit"


def test_torchtune_0_1_qlora_is_fixed_by_the_release_that_chunks() -> None:
    """llama-2-70b QLoRA under torchtune 0.1 on an RTX A6000: the step fits with the margin, its init (torchao 0.1's
    unchunked NF4) does not; the least disruptive fix is torchtune 0.2.0 (pinning torchao 0.3.1), nothing else changed
    -- and no such rung where the release already chunks, nor one that would downgrade a newer torchtune."""
    from oomlab.core.setup import make_setup
    from oomlab.remedies.ladder import Rung, climb
    from oomlab.remedies.remedy import Evaluator, Route, launcher

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    setup = make_setup("llama-2-70b", gpu="rtx-a6000", gpus=1, method="qlora", precision="bf16", batch=1, seq=512,
                       checkpointing=True, lora_targets=targets, versions={"torchtune": "0.1.0"})
    decision = climb(setup, Evaluator(512 * 2**30, None))
    assert not decision.verdict.fits and decision.verdict.evaluation.result.loading_peaks
    assert [s.rung for s in decision.steps] == [Rung.CHUNKED_NF4]
    fix = decision.setup
    assert fix.versions.release("torchtune") == (0, 2, 0) and fix.versions.release("torchao") == (0, 3, 1)
    assert fix.with_(versions=setup.versions) == setup  # nothing else changed
    assert decision.fixed.fits and decision.fixed.evaluation.result.load is None
    assert launcher(Route.PROCESS_PER_GPU, fix.strategy, fix.versions.framework).startswith("tune run")
    for versions in ({"torchtune": "0.2.0"}, {"torchtune": "0.4.0", "torchao": "0.1"}):
        newer = climb(setup.with_(versions=versions), Evaluator(512 * 2**30, None))
        assert Rung.CHUNKED_NF4 not in [s.rung for s in newer.steps], versions
