"""Tests for oomlab.pipeline.runner: the staged run and its swap into out_dir, and what a run prints."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from oomlab.core.errors import OomlabError, PipelineError
from oomlab.pipeline import runner
from oomlab.pipeline.runner import NotebookRun, render_notebook_run, run_pipeline
from tests.pipeline.test_pipeline import make_notebook

# Like notebook 03: launch files under out_dir/configs, their folder recorded in the results.
WRITES_CONFIGS = (
    "from pathlib import Path\n"
    "from oomlab.report.results import write_results\n"
    "cfg = Path(out_dir) / 'configs'\n"
    "cfg.mkdir(exist_ok=True)\n"
    "(cfg / 'launch.yaml').write_text(f'cd {cfg}\\n')\n"
    "print(f'written to {cfg}')\n"
    "write_results(results_path, {'config_dir': str(cfg)})"
)
OUT_DIR_PARAMETERS = 'model = "llama-13b"\ngpus = 1\nresults_path = ""\nout_dir = ""\n'
# What the real notebooks' kernels print outside the cells: C++ on file descriptors 1 and 2 (torch's profiler
# "USDT" lines), a library warning, ordinary prints.
CHATTY = (
    "import os, sys, warnings\n"
    "os.write(2, b'USDT:fake SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
    "os.write(1, b'fd one from C\\n')\n"
    "warnings.warn('old api', FutureWarning)\n"
    "print('printed to stdout')\n"
    "print('printed to stderr', file=sys.stderr)"
)
NOTEBOOK_LINE = re.compile(r"^\d\d_\S+\.ipynb +\d+\.\d s$")


def tree(folder: Path) -> dict[str, str | None]:
    """Every path under ``folder``, relative, with its SHA-256 (None for a folder)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
    }


def tiny_pipeline(notebooks: Path, broken: str | None = None) -> Path:
    """01 writes launch files like notebook 03; 02 prints; ``broken`` as a last cell of 02 makes it fail."""
    notebooks.mkdir(exist_ok=True)
    make_notebook(notebooks / "01_configs.ipynb", "Configs", [WRITES_CONFIGS], parameters=OUT_DIR_PARAMETERS,
                  results=False)
    make_notebook(notebooks / "02_story.ipynb", "Story", ["print('story')", *([broken] if broken else [])])
    return notebooks


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    """out_dir holding a finished run, a trace cache and a file of the user's."""
    out = tmp_path / "out"
    run_pipeline({}, out_dir=out, notebooks_dir=tiny_pipeline(tmp_path / "notebooks"))
    (out / "cache").mkdir()
    (out / "cache" / "trace-abc.json").write_text('{"peak": 1}')
    (out / "report-screenshot.png").write_bytes(b"\x89PNG fake")
    return out


def beside(out: Path) -> list[str]:
    """What lies beside ``out`` that the pipeline made (staging or failed folders)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


# ------------------------------------------------------------------------------ a failed run loses nothing


def test_failed_run_leaves_out_dir_byte_for_byte(finished: Path) -> None:
    """A run failing in its last notebook leaves every file of the finished run in out_dir as it was."""
    before = tree(finished)
    assert {"results/01_configs.json", "results/02_story.json", "configs/launch.yaml", "report.html",
            "notebooks/02_story.ipynb", "cache/trace-abc.json"} <= set(before)
    notebooks = tiny_pipeline(finished.parent / "notebooks", broken="# fails\nraise KeyError('fsdp2')")
    with pytest.raises(PipelineError) as info:
        run_pipeline({}, out_dir=finished, notebooks_dir=notebooks)
    assert tree(finished) == before
    kept = finished.parent / ".out.failed"
    assert str(info.value).startswith(
        "notebook 02_story.ipynb failed at cell 4 ('# fails'): KeyError: 'fsdp2'; the executed notebook is kept at"
        f" {kept / 'notebooks' / '02_story.ipynb'}; {finished} is left as it was (the failed run is in {kept}")
    assert (kept / "notebooks" / "02_story.ipynb").is_file() and (kept / "configs" / "launch.yaml").is_file()
    assert beside(finished) == [".out.failed"]


def test_failed_run_kept_beside_a_folder_it_never_creates(tmp_path: Path) -> None:
    """Into a new folder, failures create nothing there; the last failed run is kept, one folder only."""
    out = tmp_path / "new" / "out"
    notebooks = tiny_pipeline(tmp_path / "notebooks", broken="1 / 0")
    for _ in range(2):
        with pytest.raises(PipelineError, match=r"^notebook 02_story\.ipynb failed at cell 4 \('1 / 0'\)"):
            run_pipeline({}, out_dir=out, notebooks_dir=notebooks)
    assert not out.exists()
    assert beside(out) == [".out.failed"]
    kept = out.parent / ".out.failed"
    assert sorted(p.name for p in kept.iterdir()) == ["configs", "logs", "notebooks", "results"]
    # the kept run names its own folder, so its notebooks can be re-run where they are
    assert json.loads((kept / "results" / "01_configs.json").read_text()) == {"config_dir": str(kept / "configs")}


def test_out_dir_that_is_a_file_is_refused_before_running(tmp_path: Path) -> None:
    """An output 'folder' that is a file is bad input, refused before any notebook runs or anything is staged."""
    out = tmp_path / "out"
    out.write_text("not a folder")
    with pytest.raises(OomlabError) as info:
        run_pipeline({}, out_dir=out, notebooks_dir=tiny_pipeline(tmp_path / "notebooks"))
    assert str(info.value) == f"output folder {str(out)!r} is a file; give a folder (new or holding a run)"
    assert beside(out) == []


def test_swap_failure_restores_previous_run(finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If a rename of the swap fails, the renames already done are undone and out_dir is as it was."""
    before = tree(finished)
    rename, failed = os.rename, []

    def failing_rename(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        if Path(target) == finished / "report.html" and not failed:  # the last rename in: the others are done
            failed.append(target)
            raise OSError(28, "No space left on device")
        rename(source, target)

    monkeypatch.setattr(runner.os, "rename", failing_rename)
    with pytest.raises(PipelineError, match=f"^could not move the finished run into {re.escape(str(finished))}: "
                                            r"\[Errno 28\] No space left on device; "):
        run_pipeline({}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    assert tree(finished) == before


def test_swap_that_cannot_be_undone_says_what_to_move(finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When undoing a failed swap fails too, the error says which rename to do by hand and claims nothing else."""
    old_report = (finished / "report.html").read_bytes()
    rename = os.rename

    def failing_rename(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        if Path(target) == finished / "report.html":  # both the swap's last rename and its undo
            raise OSError(28, "No space left on device")
        rename(source, target)

    monkeypatch.setattr(runner.os, "rename", failing_rename)
    with pytest.raises(PipelineError) as info:
        run_pipeline({}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    kept = finished.parent / ".out.failed"
    assert str(info.value) == (
        f"moving the run into {finished} failed ([Errno 28] No space left on device) and could not be undone: move"
        f" {kept / '.previous' / 'report.html'} -> {finished / 'report.html'} by hand (the failed run is in {kept},"
        " each kernel's own output under logs/)")
    assert (kept / ".previous" / "report.html").read_bytes() == old_report


def test_successful_run_replaces_the_run_and_keeps_the_rest(finished: Path) -> None:
    """A new run replaces notebooks, results, configs and report whole; cache and other files stay in place."""
    (finished / "results" / "99_stale.json").write_text("{}")
    (finished / "configs" / "stale.yaml").write_text("old")
    cache_inode = (finished / "cache").stat().st_ino
    cache_before = tree(finished / "cache")
    result = run_pipeline({"gpus": 3}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    assert sorted(p.name for p in finished.iterdir()) == [
        "cache", "configs", "notebooks", "report-screenshot.png", "report.html", "results"]
    assert not (finished / "results" / "99_stale.json").exists()
    assert not (finished / "configs" / "stale.yaml").exists()
    assert json.loads((finished / "results" / "02_story.json").read_text())["gpus"] == 3
    assert (finished / "cache").stat().st_ino == cache_inode and tree(finished / "cache") == cache_before
    assert (finished / "report-screenshot.png").read_bytes() == b"\x89PNG fake"
    assert result.executed_paths == (finished / "notebooks" / "01_configs.ipynb",
                                     finished / "notebooks" / "02_story.ipynb")
    assert beside(finished) == []


def test_swapped_run_names_the_folder_it_lives_in(finished: Path) -> None:
    """Results, launch files and executed notebooks name out_dir, never the staging folder they ran in."""
    configs = finished / "configs"
    assert json.loads((finished / "results" / "01_configs.json").read_text()) == {"config_dir": str(configs)}
    assert (configs / "launch.yaml").read_text() == f"cd {configs}\n"
    executed = nbformat.read(finished / "notebooks" / "01_configs.ipynb", as_version=4)
    assert f"out_dir = {str(finished)!r}" in executed.cells[2].source.replace('"', "'")
    assert executed.cells[3].outputs[0].text == f"written to {configs}\n"
    for path in finished.rglob("*"):
        assert path.is_dir() or ".out.run-" not in path.read_text(errors="replace"), path


# ------------------------------------------------------------------------------------------------ noise


def test_notebook_line_names_notebook_and_time() -> None:
    """The per-notebook line is the name, padded, then the seconds to one decimal."""
    assert render_notebook_run(NotebookRun("01_reproduce_oom.ipynb", 12.34)) == "01_reproduce_oom.ipynb       12.3 s"


def test_run_is_silent_by_default_and_reports_each_notebook(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """Without verbose nothing reaches file descriptors 1 or 2 (kernel warnings, C++ lines, cell output);
    on_notebook gets each notebook, in order, with its time."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    make_notebook(notebooks / "01_chatty.ipynb", "Chatty", [CHATTY])
    make_notebook(notebooks / "02_quiet.ipynb", "Quiet", [])
    runs: list[NotebookRun] = []
    result = run_pipeline({}, out_dir=tmp_path / "out", notebooks_dir=notebooks, on_notebook=runs.append)
    assert capfd.readouterr() == ("", "")
    assert [r.name for r in runs] == ["01_chatty.ipynb", "02_quiet.ipynb"] and all(r.seconds > 0 for r in runs)
    assert result.notebooks == tuple(runs)


def test_verbose_shows_kernel_and_cell_output(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """verbose=True lets the kernel's own stderr through and echoes the cells' stdout and stderr."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    make_notebook(notebooks / "01_chatty.ipynb", "Chatty", [CHATTY])
    run_pipeline({}, out_dir=tmp_path / "out", notebooks_dir=notebooks, verbose=True)
    out, err = capfd.readouterr()
    assert "[IPKernelApp] WARNING | Kernel is running over TCP" in err
    assert "profiler_start" in err and "FutureWarning: old api" in err and "printed to stderr" in err
    assert "printed to stdout" in out


def test_cli_run_prints_only_its_own_lines(tmp_path: Path) -> None:
    """`python -m oomlab run` on chatty notebooks writes nothing to stderr and only notebook/report lines."""
    root, out = tmp_path / "root", tmp_path / "out"
    notebooks = root / "notebooks"
    notebooks.mkdir(parents=True)
    make_notebook(notebooks / "01_chatty.ipynb", "Chatty", [CHATTY])
    env = {**os.environ, "OOMLAB_ROOT": str(root)}
    proc = subprocess.run([sys.executable, "-m", "oomlab", "run", "--no-progress", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[-1] == f"report: {out / 'report.html'}"
    assert all(NOTEBOOK_LINE.match(line) for line in lines[:-1]), lines
