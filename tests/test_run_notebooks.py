"""The real notebooks through the real pipeline (papermill) into a temporary folder."""

import json

import pytest

from oomlab.paths import NOTEBOOKS_DIR
from oomlab.pipeline import parse_params, run_pipeline


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    result = run_pipeline(parse_params([]), out_dir=out, notebooks_dir=NOTEBOOKS_DIR, progress=False)
    return out, result


def test_notebook01_reproduces_the_seed(seed_run) -> None:
    """Notebook 01's results JSON holds the reproduced OOM with all five figures matching the seed."""
    out, _ = seed_run
    results = json.loads((out / "results" / "01_reproduce_oom.json").read_text())
    assert results["reproduce"]["exception"] == "torch.OutOfMemoryError"
    assert [row["matches"] for row in results["seed_comparison"]] == [True] * 5
    assert results["reproduce"]["failing_tensor"]["name"] == "model.layers.23.mlp.gate_proj.weight"


def test_report_holds_the_reproduced_message_beside_the_seed(seed_run) -> None:
    """report.html shows the reproduced message, the comparison table and an embedded figure."""
    out, result = seed_run
    html = (out / "report.html").read_text()
    assert "Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; 14.16 GiB already allocated" in html
    assert "user's message (seed)" in html
    assert "data:image/png;base64," in html
    assert (out / "notebooks" / "01_reproduce_oom.ipynb").is_file()


def test_other_case_runs_end_to_end(tmp_path) -> None:
    """A case that fits (llama-7b on one A100 80GB) runs and says so."""
    params = parse_params(["model=llama-7b", "gpu=a100-80gb", "gpus=1"])
    run_pipeline(params, out_dir=tmp_path, notebooks_dir=NOTEBOOKS_DIR, progress=False)
    results = json.loads((tmp_path / "results" / "01_reproduce_oom.json").read_text())
    assert results["reproduce"]["raised"] is False
    assert "succeeded" in (tmp_path / "report.html").read_text()
