"""``oomlab check`` shown: the setup table, the traceback's reading and the Markdown table, each written once."""

from pathlib import Path

import pytest

from oomlab.core.markdown import markdown_table
from oomlab.launch import inputs, resolve
from oomlab.launch.check import check_launch
from oomlab.launch.display import render_check, render_markdown, traceback_sentence
from oomlab.launch.inputs import check_inputs, inputs_from_dir
from oomlab.launch.user import setup_rows

TWIN = Path(__file__).parents[1] / "fixtures" / "open-assistant"


@pytest.fixture(scope="module")
def seed_check():
    return check_launch(check_inputs(launch_dir=TWIN / "seed", model="llama-13b", gpu="t4", gpus=4))


def test_markdown_table_escapes_and_aligns() -> None:
    """One builder: cells escaped (| and line breaks), right-aligned columns marked, an empty cell a single space."""
    text = markdown_table(("a", "b"), [("x|y", "1\n2"), ("z", "")], right=(1,))
    assert text.splitlines() == ["| a | b |", "|---|---:|", "| x\\|y | 1 2 |", "| z | |"]
    assert markdown_table(("a",), []) == "| a |\n|---|"


def test_check_shows_the_setup_rows(seed_check) -> None:
    """The plain answer's setup lines are setup_rows, the table notebook 01 shows."""
    text = render_check(seed_check)
    rows = setup_rows(seed_check.launch)
    wide = max(len(name) for name, _, _ in rows)  # one column for the names, as wide as the longest
    assert rows and all(f"  {name:<{wide}} {value:<28} {origin}" in text for name, value, origin in rows)
    assert ("precision", "fp16-mixed") in {(name, value) for name, value, _ in rows}


def test_the_reply_reads_the_traceback_as_notebook_01_does(seed_check) -> None:
    """The Markdown reply's launch path is notebook 01's reading (prose.traceback_proves), said of a traceback that
    would happen: check reads none."""
    sentence = traceback_sentence(seed_check)
    assert "would prove that its launcher moved a full replica to each GPU with `Module.to()`: one of" in sentence
    assert "; not ZeRO-3 under zero.Init" in sentence and sentence.endswith("is one of them.")
    md = render_markdown(seed_check)
    assert "| per GPU | |\n|---|---:|\n| load (deepspeed-to) |" in md


def test_a_launch_that_cannot_raise_it_is_not_said_to_have_run() -> None:
    """ZeRO-3 under zero.Init cannot fail in Module._apply: the reply says so, not that "the launch that ran
    differed" (check has no traceback, so nothing ran)."""
    result = check_launch(check_inputs(launch_dir=TWIN / "zero3", model="llama-13b", gpu="t4", gpus=4))
    sentence = traceback_sentence(result)
    assert sentence.endswith("(zero3: ZeRO-3 under zero.Init) is not one of them: it cannot fail there.")
    assert "that ran" not in sentence and "could not happen" not in sentence
    assert f"**Launch path.** {sentence}\n" in render_markdown(result)


def test_a_folder_is_read_by_inputs() -> None:
    """Folder discovery lives in launch.inputs (whose docstring says so), not beside the resolver."""
    assert not hasattr(resolve, "inputs_from_dir") and inputs.inputs_from_dir is inputs_from_dir
    found = inputs_from_dir(TWIN / "seed", gpu="t4", gpus=4)
    assert found.deepspeed and found.deepspeed.endswith("zero_config.json") and found.command


def test_the_reply_shows_hostile_keys_as_text(tmp_path) -> None:
    """YAML keys and values such as ``<script>`` reach the GitHub reply as escaped text: rendered, no element of theirs
    and no link, and the user's characters still read."""
    from bs4 import BeautifulSoup
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    from oomlab.report.sanitize import live_markup

    folder = tmp_path / "launch <img src=x onerror=alert(1)>"
    folder.mkdir()
    (folder / "launch.txt").write_text("accelerate launch --config_file accelerate.yaml train.py --run_name "
                                       "'`[x](javascript:alert(1))`'\n")
    (folder / "accelerate.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 4\n"
                                            "'<script>alert(1)</script>': 1\n"
                                            "'[y](javascript:alert(2))': '<b onclick=alert(3)>b</b>'\n")
    result = check_launch(check_inputs(launch_dir=folder, model="llama-7b", gpu="t4", gpus=4))
    html = markdown2html_mistune(render_markdown(result))
    soup = BeautifulSoup(html, "html.parser")
    assert live_markup(f"<html><body>{html}</body></html>") == []
    assert not soup.find_all(["script", "img", "b"]) and all(a.get("href", "").startswith("http") for a in soup("a"))
    assert "<script>alert(1)</script>" in soup.get_text()
