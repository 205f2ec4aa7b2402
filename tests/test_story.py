"""The report's story: read from results, generic for any case, user text escaped."""

import json

import pytest

from oomlab import story


@pytest.fixture()
def results(tmp_path):
    """Minimal results of notebooks 01-03 for a user model whose path holds markup."""
    evil = "/tmp/<img src=x onerror=alert(1)>/config.json"
    reproduce = {
        "case": {"model": evil, "dtype": "float16", "gpu": "a10g", "gpus": 1, "device": "simulated"},
        "reproduce": {"model": evil, "dtype": "float16", "gpu": "a10g", "device": "simulated", "raised": True,
                      "exception": "torch.OutOfMemoryError", "message": "CUDA out of memory. <b>x</b>",
                      "moved_fraction": 0.5, "model_reserved_bytes": 40 * 2**30, "total_bytes": 22 * 2**30,
                      "allocated_bytes": 21 * 2**30, "free_bytes": 2**20, "outside_pytorch_bytes": 500 * 2**20,
                      "outside_pytorch_source": "given", "failing_tensor": {"name": "<t>", "shape": [2, 3],
                                                                          "dtype": "float16"}},
        "seed_comparison": [], "explain": {"verdict": "a <verdict>"}, "explain_label": "the reproduced message",
    }
    configured = {"strategy": "single", "method": "full", "precision": "fp16-mixed", "optimizer": "adamw", "batch": 1,
                  "seq": 2048, "per_gpu_peak_bytes": 200 * 2**30, "headroom_bytes": -178 * 2**30, "fits": False,
                  "notes": ["a note"]}
    budget = {"case": {"model": evil, "gpu": "a10g", "gpus": 1}, "configured": configured, "variants": [],
              "agreement": {"setups": 28, "worst_ratio": 1.01, "worst_setup": "x", "tolerance": 0.02}}
    plan = {"case": {"model": evil}, "knobs": [], "seed": {}, "remedies": [], "recommended": None,
            "assumptions": ["MFU 0.35"], "verification": {}, "config_files": {}}
    (tmp_path / "results").mkdir()
    for stem, data in (("01_reproduce_oom", reproduce), ("02_memory_budget", budget), ("03_remediations", plan)):
        (tmp_path / "results" / f"{stem}.json").write_text(json.dumps(data))
    return story.load_results(tmp_path)


def test_user_text_is_escaped(results) -> None:
    """A model path with markup reaches the report as text, not as a tag."""
    text = story.title(results) + story.answer(results) + story.reproduction(results) + story.message(results)
    text += story.decoded(results) + "".join(story.assumptions(results))
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "<b>" not in text and "<t>" not in text and "<verdict>" not in text


def test_answer_for_another_case_mentions_nothing_of_the_seed(results) -> None:
    """One GPU: no pooling sentence, no seed figures; no remedy: said plainly."""
    text = story.answer(results)
    assert "As configured, no." in text and "do not pool" not in text
    assert "No configuration oomlab knows fits these GPUs" in text
    assert "llama-13b" not in text and "T4" not in text
    assert story.seed_table_rows(results) == []


def test_missing_results_name_the_notebook(tmp_path) -> None:
    """Running the report before the analyses says which notebook to run."""
    with pytest.raises(FileNotFoundError, match="run notebook 01_reproduce_oom first"):
        story.load_results(tmp_path)
