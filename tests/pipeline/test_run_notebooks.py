"""The real notebooks through the real pipeline (papermill) into a temporary folder, and the report in a browser."""

import json
import re

import pytest

from oomlab.core.paths import NOTEBOOKS_DIR, OUTPUTS_DIR
from oomlab.pipeline.params import parse_params
from oomlab.pipeline.runner import run_pipeline

pytestmark = pytest.mark.heavy  # runs the notebooks with papermill: `pytest -m "not heavy"` leaves it out


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


def test_every_notebook_wrote_results(seed_run) -> None:
    """01-04 ran in order, each wrote its results JSON, and the launch files exist."""
    out, result = seed_run
    names = [p.name for p in result.executed_paths]
    assert names == ["01_reproduce_oom.ipynb", "02_memory_budget.ipynb", "03_remediations.ipynb", "04_report.ipynb"]
    for name in names:
        assert (out / "results" / name.replace(".ipynb", ".json")).is_file()
    plan = json.loads((out / "results" / "03_remediations.json").read_text())
    assert plan["recommended"]
    assert all((out / "configs" / name).is_file() for name in plan["recommended"]["config_files"])


def test_report_tells_the_seeds_story(seed_run) -> None:
    """report.html is notebook 04: the answer, the reproduced message beside the user's, an embedded figure."""
    out, result = seed_run
    html = (out / "report.html").read_text()
    assert "As configured, no." in html and "Can llama-13b train on 4 × Tesla T4?" in html
    assert "Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; 14.16 GiB already allocated" in html
    assert "user's message" in html
    assert "data:image/png;base64," in html
    assert not re.search(r"<script\b[^>]*\bsrc=|<link\b[^>]*href=\"?https?:|@import|unpkg|cdnjs|jsdelivr", html)


def test_report_shows_no_raw_markdown(seed_run) -> None:
    """Every Markdown block of the seed's report is rendered: no **, ```, table rule, [link](...) or # heading as text
    (LAUNCH.md included), the command in a code block, the remedies figure beside the ranked table."""
    from oomlab.report.html import raw_markdown

    out, _ = seed_run
    html = (out / "report.html").read_text()
    assert raw_markdown(html) == []
    assert re.search(r"<pre>accelerate launch \\\n {4}--", html)
    ranked = html.index('id="The-remedies,-ranked"')
    assert html.index("data:image/png;base64,", ranked) < html.index('id="The-recommended-fix"')


def test_report_in_headless_chromium(seed_run, browser) -> None:
    """Zero network requests, no console errors, every image decoded, the verdict visible; a screenshot saved."""
    out, _ = seed_run
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requests, errors = [], []
    page.on("request", lambda req: requests.append(req.url) if not req.url.startswith(("file:", "data:")) else None)
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto((out / "report.html").as_uri(), wait_until="load")
    assert requests == [] and errors == []
    assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    assert page.evaluate("document.images.length") >= 1
    assert page.get_by_text("As configured, no.").first.is_visible()
    OUTPUTS_DIR.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUTS_DIR / "report-screenshot.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing wider than the screen but tables
    overflow = page.evaluate("document.documentElement.scrollWidth")
    assert overflow <= 400
    page.close()


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        (["model=llama-2-7b", "gpu=a10g", "gpus=1"], "Can llama-2-7b train on 1 × NVIDIA A10G?"),
        (["model=llama-7b", "gpu=h200", "gpus=1"], "Can llama-7b train on 1 × NVIDIA H200?"),  # fits outright
    ],
)
def test_other_cases_tell_their_own_story(pairs, expected, tmp_path) -> None:
    """Another model and GPU give a coherent report that assumes nothing of the seed's answer."""
    run_pipeline(parse_params(pairs), out_dir=tmp_path, notebooks_dir=NOTEBOOKS_DIR, progress=False)
    html = (tmp_path / "report.html").read_text()
    assert expected in html and "Loading works" in html
    for seed_text in ("llama-13b", "Tesla T4", "14.75 GiB", "user's message"):
        assert seed_text not in html, seed_text
    budget = json.loads((tmp_path / "results" / "02_memory_budget.json").read_text())
    if "h200" in pairs[1]:
        assert budget["configured"]["fits"] is True and "and fits" in html
