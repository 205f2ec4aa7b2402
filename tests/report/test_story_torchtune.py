"""The report's answer for a torchtune 0.1 QLoRA run (issue 24): loading's peak named as such, the margin said, the
fix the upgrade -- and nothing of the HF load path."""

from __future__ import annotations

from typing import Any

import pytest

from oomlab.budget.display import budget_variants, configured_variants
from oomlab.core.gpus import load_gpu
from oomlab.core.setup import make_setup
from oomlab.evidence import agreement
from oomlab.remedies.launch_writer import plan_launch_command
from oomlab.remedies.plan import make_plan
from oomlab.report import story
from oomlab.report.results import budget_results, plan_results, reproduce_results, write_results
from oomlab.reproduction.outside import seed_outside_bytes
from oomlab.reproduction.replay import reproduce

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
RUN = {"model": "llama-2-70b", "gpu": "rtx-a6000", "gpus": 1, "strategy": "single", "method": "qlora",
       "precision": "bf16", "batch": 1, "seq": 512, "checkpointing": True, "lora_targets": TARGETS,
       "versions": {"torchtune": "0.1.0"}}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("torchtune")
    result = reproduce(model="llama-2-70b", gpu="rtx-a6000", device="simulated")
    fp32 = reproduce(model="llama-2-70b", gpu="rtx-a6000", dtype="float32", device="simulated")
    write_results(root / "results" / "01_reproduce_oom.json", reproduce_results(
        {"model": "llama-2-70b", "dtype": "float16", "gpu": "rtx-a6000", "gpus": 1, "device": result.device}, result,
        fp32, None, None, None, None, 1))
    variants = budget_variants(configured_variants(make_setup(**RUN)))
    committed = agreement.load_committed()
    write_results(root / "results" / "02_memory_budget.json", budget_results(
        {"model": "llama-2-70b", "gpu": "rtx-a6000", "gpus": 1}, load_gpu("rtx-a6000"), 1, seed_outside_bytes(),
        variants, committed, agreement.worst_row(committed), {}, []))
    plan = make_plan(**{k: v for k, v in RUN.items()})
    command = plan_launch_command(plan, plan.recommended, "meta-llama/Llama-2-70b-hf")
    assert command is None  # no HF launch for a torchtune run
    write_results(root / "results" / "03_remediations.json", plan_results(
        {"model": "llama-2-70b", "gpu": "rtx-a6000", "gpus": 1}, plan, command, None, {}, plan.device_map, [], {}))
    from oomlab.report.results import load_results
    return load_results(root)


def test_the_answer_names_loadings_peak_and_the_upgrade(results) -> None:
    text = story.answer(results)
    assert "bitsandbytes" not in text  # torchtune's own loading, not the HF 4-bit path
    assert "torchtune's own model build and load" in text
    assert "That peak is loading's, not the step's: torchtune's QLoRA init on torchao 0.1" in text
    assert "does not fit" in text  # loading needs more than the GPU
    assert "torchtune==0.2.0" in text


def test_the_fix_is_launched_in_torchtune_not_by_an_hf_script(results) -> None:
    text = story.recommended_fix(results)
    assert "accelerate launch" not in text and "train.py` is a transformers + peft script" in text
    assert "your own torchtune launch" in text and "pip install" in text


def test_the_bar_shows_loadings_need() -> None:
    """The report's bar for a run whose load peaks: the per-GPU figure is loading's, outlined beyond the step."""
    from oomlab.budget import estimate
    from oomlab.report.figures import BarRow

    result = estimate(**RUN)
    row = BarRow.from_dict({**result.to_dict(), "label": "as configured"})
    assert row.total_bytes == result.per_gpu_peak_bytes > row.step_bytes and not row.fits


def test_the_reports_launchers_are_the_frameworks(results) -> None:
    """Read back from the results JSON, each remedy keeps its framework: the report names torchtune's launcher as
    the CLI does, and an HF-only launch says it is not torchtune's."""
    rows = story.remedy_rows(results)
    launchers = [row[2] for row in rows]
    assert launchers[0].startswith("tune run")
    assert all(w.startswith("tune run") or "not a torchtune launch" in w for w in launchers)
