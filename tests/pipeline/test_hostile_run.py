"""One real pipeline run whose every user-controlled text carries markup: the report shows it as text, runs none of it.

The fields a user controls in a run: the model's path (its folder's name) and its config.json's fields, the launch
folder's name, the launch command and every file's keys and values.  Each carries an image with an ``onerror``
handler, a ``javascript:`` Markdown link, backticks (one after a backslash: the old escaping's bypass), a ``<script>``
and emphasis.  The case is not the seed's (llama-2-7b's config on one A10G), so the same run also checks that the
report tells that user's story.
"""

from __future__ import annotations

import json
import re

import pytest
from bs4 import BeautifulSoup

from oomlab.core.paths import MODEL_SPECS_DIR, NOTEBOOKS_DIR
from oomlab.pipeline.params import parse_params
from oomlab.pipeline.runner import run_pipeline
from oomlab.report.html import raw_markdown
from oomlab.report.sanitize import live_markup

pytestmark = pytest.mark.heavy  # runs the whole pipeline: `pytest -m "not heavy"` leaves it out

IMG = "<img src=x onerror=alert(1)>"
LINK = "[click me](javascript:alert(3))"
SCRIPT = "<script>alert(7)</script>"
TICKS = "\\`x\\` `y`"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    model_dir = root / f"model {IMG} {LINK}"
    model_dir.mkdir()
    config = json.loads((MODEL_SPECS_DIR / "llama-2-7b.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    config["_name_or_path"] = LINK
    config["torch_dtype"] = "float16"
    (model_dir / "config.json").write_text(json.dumps(config))
    launch = root / f"launch {IMG} {LINK} `tick` *star*"
    launch.mkdir()
    (launch / "launch.txt").write_text(
        f"python train.py --run_name '{IMG} {TICKS}' --output_dir '{LINK}' --per_device_train_batch_size 1"
        " --gradient_checkpointing --bf16\n")
    (launch / "training_args.json").write_text(json.dumps(
        {"per_device_train_batch_size": 1, "gradient_checkpointing": True, "bf16": True, "max_length": 1024,
         "logging_dir": f"{IMG} {SCRIPT}", SCRIPT: LINK, f"{IMG}": TICKS}))
    out = root / "out"
    params = parse_params([f"model={model_dir / 'config.json'}", f"launch_dir={launch}", "gpu=a10g", "gpus=1"])
    run_pipeline(params, out_dir=out, notebooks_dir=NOTEBOOKS_DIR, progress=False)
    return (out / "report.html").read_text()


def test_report_has_no_live_markup(hostile_run) -> None:
    """Parsed, the page has no on* attribute, no script/vbscript/data link and no <script>."""
    html = hostile_run
    assert live_markup(html) == []
    soup = BeautifulSoup(html, "html.parser")
    assert soup.find_all("script") == []
    for tag in soup.find_all(True):
        for name, value in tag.attrs.items():
            assert not name.lower().startswith("on"), (tag.name, name)
            text = " ".join(value) if isinstance(value, list) else str(value)
            assert not re.match(r"\s*(javascript|vbscript|data:text)", text, re.IGNORECASE), (tag.name, name, text)


def test_user_text_is_shown_as_its_characters(hostile_run) -> None:
    """The markup reads as the user wrote it, and no rendered-Markdown marker is left over."""
    text = BeautifulSoup(hostile_run, "html.parser").find("main").get_text(" ")
    assert f"Can {LINK} train on 1 × NVIDIA A10G?" in text  # the config's _name_or_path names the model
    for piece in (IMG, LINK, "`tick` *star*"):
        assert piece in text, piece
    assert raw_markdown(hostile_run) == []


def test_report_tells_this_users_story(hostile_run) -> None:
    """Not the seed's case: none of the seed's figures or words."""
    for seed_text in ("llama-13b", "Tesla T4", "14.75 GiB", "user's message"):
        assert seed_text not in hostile_run, seed_text
