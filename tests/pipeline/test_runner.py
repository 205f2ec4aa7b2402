"""Tests for oomlab.pipeline.runner: the staged run and its swap into out_dir, and what a run prints."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from oomlab.core.errors import OomlabError, OutputFolderError, PipelineError
from oomlab.pipeline import runner
from oomlab.pipeline.ownership import MANIFEST_NAME, manifest_of, write_manifest
from oomlab.pipeline.runner import NotebookRun, render_notebook_run, run_pipeline
from tests.pipeline.test_pipeline import make_notebook

pytestmark = pytest.mark.heavy  # starts kernels and CLI processes: `pytest -m "not heavy"` leaves it out

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
    # the kept run names its own folder (relative to its notebooks), so its notebooks can be re-run where they are
    assert json.loads((kept / "results" / "01_configs.json").read_text()) == {"config_dir": "../configs"}


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
    """A second run replaces notebooks, results, configs and report of the first whole; cache and other files stay
    in place; its manifest lists what it moved in."""
    (finished / "results" / "01_configs.json").unlink()  # a file of the run the user deleted: nothing to lose
    cache_inode = (finished / "cache").stat().st_ino
    cache_before = tree(finished / "cache")
    result = run_pipeline({"gpus": 3}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    assert sorted(p.name for p in finished.iterdir()) == [
        ".oomlab-run.json", "cache", "configs", "notebooks", "report-screenshot.png", "report.html", "results"]
    assert json.loads((finished / "results" / "02_story.json").read_text())["gpus"] == 3
    assert (finished / "cache").stat().st_ino == cache_inode and tree(finished / "cache") == cache_before
    assert (finished / "report-screenshot.png").read_bytes() == b"\x89PNG fake"
    assert result.executed_paths == (finished / "notebooks" / "01_configs.ipynb",
                                     finished / "notebooks" / "02_story.ipynb")
    assert beside(finished) == []
    listed = {f["path"]: f["sha256"] for f in json.loads((finished / MANIFEST_NAME).read_text())["files"]}
    assert listed == {path: digest for path, digest in tree(finished).items()
                      if digest is not None and path.split("/")[0] in runner.RUN_ENTRIES}


def test_swapped_run_names_the_folder_it_lives_in(finished: Path) -> None:
    """Results, launch files and executed notebooks name the run's folder relative to the executed notebook (as
    Jupyter opened there would), never the staging folder they ran in: nothing is rewritten after the swap."""
    configs = finished / "configs"
    assert json.loads((finished / "results" / "01_configs.json").read_text()) == {"config_dir": "../configs"}
    assert (configs / "launch.yaml").read_text() == "cd ../configs\n"
    executed = nbformat.read(finished / "notebooks" / "01_configs.ipynb", as_version=4)
    assert "out_dir = '..'" in executed.cells[2].source.replace('"', "'")
    assert executed.cells[3].outputs[0].text == "written to ../configs\n"
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


# ------------------------------------------------------------------------------- no run deletes a user's files

USER_FILES = {"notebooks/analysis.ipynb": b'{"cells": []}', "results/important.csv": b"gpu,peak\nt4,14.75\n",
              "configs/my.yaml": b"model: llama-13b\n"}


def no_notebook_may_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_notebook(*args: object) -> None:
        raise AssertionError("a notebook ran")

    monkeypatch.setattr(runner, "run_notebook", run_notebook)


def refused_before_running(out: Path) -> str:
    """The refusal's tail for a run stopped before any notebook ran, naming the entry to move."""
    return "so nothing was run and nothing changed: choose another --out, or move {entry} out of " + str(out)


@pytest.mark.parametrize("user_file", [*USER_FILES, "report.html"])
def test_a_user_s_files_are_refused_before_any_notebook_runs(tmp_path: Path, user_file: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder holding a user's notebooks/, results/, configs/ or report.html (no manifest): refused, unchanged."""
    out = tmp_path / "out"
    (out / user_file).parent.mkdir(parents=True, exist_ok=True)
    (out / user_file).write_bytes(b"mine")
    before = tree(out)
    no_notebook_may_run(monkeypatch)
    with pytest.raises(OutputFolderError) as info:
        run_pipeline({}, out_dir=out, notebooks_dir=tiny_pipeline(tmp_path / "notebooks"))
    entry = user_file.split("/")[0] + ("/" if "/" in user_file else "")
    assert str(info.value) == (
        f"output folder {out} holds {user_file}, which no oomlab run wrote (no .oomlab-run.json); a run replaces"
        f" {entry} whole, " + refused_before_running(out).format(entry=entry))
    assert tree(out) == before and beside(out) == []  # no staging, no lock, no failed run


def test_a_user_s_folder_of_all_three_stays_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """notebooks/analysis.ipynb, results/important.csv and configs/my.yaml together: the first one is named."""
    out = tmp_path / "out"
    for name, data in USER_FILES.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    no_notebook_may_run(monkeypatch)
    with pytest.raises(OutputFolderError, match=r" holds notebooks/analysis\.ipynb, which no oomlab run wrote "):
        run_pipeline({}, out_dir=out, notebooks_dir=tiny_pipeline(tmp_path / "notebooks"))
    assert {name: (out / name).read_bytes() for name in USER_FILES} == USER_FILES
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "configs", "configs/my.yaml", "notebooks", "notebooks/analysis.ipynb", "results", "results/important.csv"]


@pytest.mark.parametrize(
    ("edit", "named", "why"),
    [
        (lambda out: (out / "results" / "01_configs.json").write_text("{}"), "results/01_configs.json",
         "changed since oomlab wrote it (its SHA-256 differs from .oomlab-run.json's)"),
        (lambda out: (out / "configs" / "my.yaml").write_text("mine"), "configs/my.yaml",
         "which the last run did not write (.oomlab-run.json does not list it)"),
    ],
)
def test_a_previous_run_the_user_edited_is_refused(finished: Path, edit, named: str, why: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of the last run changed, or one added beside it: refused before any notebook runs, unchanged."""
    edit(finished)
    before = tree(finished)
    no_notebook_may_run(monkeypatch)
    with pytest.raises(OutputFolderError) as info:
        run_pipeline({}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    entry = named.split("/")[0] + "/"
    assert str(info.value) == (f"output folder {finished} holds {named}, {why}; a run replaces {entry} whole, "
                               + refused_before_running(finished).format(entry=entry))
    assert tree(finished) == before and beside(finished) == []


def test_a_file_added_during_the_run_is_refused_at_the_swap(finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ownership is checked again before the swap: the user's new file stays, the finished run is kept aside."""
    before = tree(finished)
    run_staged = runner._run_staged

    def run_then_user_writes(*args: object, **kwargs: object) -> list[NotebookRun]:
        runs = run_staged(*args, **kwargs)
        (finished / "results" / "important.csv").write_text("written while the run ran")
        return runs

    monkeypatch.setattr(runner, "_run_staged", run_then_user_writes)
    with pytest.raises(OutputFolderError) as info:
        run_pipeline({}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    kept = finished.parent / ".out.failed"
    assert str(info.value) == (
        f"output folder {finished} holds results/important.csv, which the last run did not write (.oomlab-run.json"
        " does not list it); a run replaces results/ whole, so the finished run was not moved in: choose another"
        f" --out, or move results/ out of {finished}; {finished} is left as it was (the finished run is in {kept})")
    assert tree(finished) == {**before, "results/important.csv": tree(finished)["results/important.csv"]}
    assert (finished / "results" / "important.csv").read_text() == "written while the run ran"
    assert (kept / "report.html").is_file() and (kept / MANIFEST_NAME).is_file()
    assert beside(finished) == [".out.failed"]


def test_a_held_lock_refuses_a_second_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another run holds the folder's lock, a run is refused naming the lock and its pid."""
    out = tmp_path / "out"
    no_notebook_may_run(monkeypatch)
    with runner.out_dir_lock(out), pytest.raises(OutputFolderError) as info:
        run_pipeline({}, out_dir=out, notebooks_dir=tiny_pipeline(tmp_path / "notebooks"))
    assert str(info.value) == (
        f"another oomlab run (pid {os.getpid()}) is writing to {out}: it holds the lock {tmp_path / '.out.lock'};"
        " nothing was run and nothing changed: wait for it to finish, or choose another --out")
    assert not out.exists() and beside(out) == []


@pytest.mark.parametrize(
    ("out_dir", "message"),
    [
        ("", "output folder '' is empty; give a folder path: a new folder, or one holding an earlier oomlab run"
             " (default outputs/)"),
        ("/proc/oomlab-test/out", "cannot write the output folder /proc/oomlab-test/out (No such file or directory:"
                                  " /proc/oomlab-test); nothing was run and nothing changed: choose another --out, a"
                                  " folder on a filesystem you can write"),
        ("/", "output folder '/' is a filesystem root; give a folder inside it"),
    ],
)
def test_an_output_folder_that_cannot_be_one_is_refused(tmp_path: Path, out_dir: str, message: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty path (the current folder by accident), a folder under /proc, a filesystem root."""
    no_notebook_may_run(monkeypatch)
    with pytest.raises(OutputFolderError) as info:
        run_pipeline({}, out_dir=out_dir, notebooks_dir=tiny_pipeline(tmp_path / "notebooks"))
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("statvfs", "reason"),
    [
        ({"f_flag": os.ST_RDONLY, "f_bavail": 100}, "Read-only file system"),
        ({"f_flag": 0, "f_bavail": 0}, "No space left on device"),
    ],
)
def test_a_read_only_or_full_filesystem_is_refused_before_running(tmp_path: Path, statvfs: dict[str, int],
                                                                  reason: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked before any notebook runs: the previous run stays as it was."""
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "01_configs.json").write_text("{}")
    write_manifest(out, manifest_of(out, runner.RUN_ENTRIES))  # a previous run's, which a run may replace
    before = tree(out)
    no_notebook_may_run(monkeypatch)
    monkeypatch.setattr(runner.os, "statvfs", lambda path: type("StatVfs", (), statvfs)())
    with pytest.raises(OutputFolderError) as info:
        run_pipeline({}, out_dir=out, notebooks_dir=tiny_pipeline(tmp_path / "notebooks"))
    assert str(info.value) == (
        f"cannot write the output folder {out} ({reason}: {tmp_path}); nothing was run and nothing changed: choose"
        " another --out, a folder on a filesystem you can write")
    assert tree(out) == before and beside(out) == []


def test_a_disk_filling_up_during_the_run_leaves_out_dir_as_it_was(finished: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No space left while writing the run: a PipelineError (exit 1) saying out_dir is left as it was."""
    before = tree(finished)

    def full(folder: Path, manifest: object) -> Path:
        raise OSError(28, "No space left on device", str(folder / MANIFEST_NAME))

    monkeypatch.setattr(runner, "write_manifest", full)
    with pytest.raises(PipelineError) as info:
        run_pipeline({}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    kept = finished.parent / ".out.failed"
    assert str(info.value) == (
        f"writing the run failed (No space left on device: {kept / MANIFEST_NAME}); {finished} is left as it was"
        f" (the failed run is in {kept}, each kernel's own output under logs/)")
    assert tree(finished) == before and beside(finished) == [".out.failed"]


def test_ctrl_c_keeps_the_partial_run_and_out_dir(finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt in the second notebook: RunInterrupted naming the kept partial run; out_dir as it was."""
    before = tree(finished)
    run_notebook = runner.run_notebook

    def interrupted(notebook: Path, *args: object) -> None:
        if notebook.name.startswith("02_"):
            raise KeyboardInterrupt
        run_notebook(notebook, *args)

    monkeypatch.setattr(runner, "run_notebook", interrupted)
    with pytest.raises(runner.RunInterrupted) as info:
        run_pipeline({}, out_dir=finished, notebooks_dir=finished.parent / "notebooks")
    kept = finished.parent / ".out.failed"
    assert info.value.kept == kept and (kept / "notebooks" / "01_configs.ipynb").is_file()
    assert tree(finished) == before and beside(finished) == [".out.failed"]


# -------------------------------------------------------------------------------------------- the CLI's words


def cli_run(root: Path, *args: str, **popen: object) -> subprocess.Popen:
    """``python -m oomlab run --no-progress ARGS`` with the notebooks under ``root`` (started, not awaited)."""
    env = {**os.environ, "OOMLAB_ROOT": str(root)}
    return subprocess.Popen([sys.executable, "-m", "oomlab", "run", "--no-progress", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_cli_refusals_exit_2_in_one_line(tmp_path: Path) -> None:
    """An empty --out, a folder under /proc, a user's folder, a held lock: exit 2, one line, no traceback."""
    root = tmp_path / "root"
    root.mkdir()
    tiny_pipeline(root / "notebooks")
    users = tmp_path / "users"
    (users / "notebooks").mkdir(parents=True)
    (users / "notebooks" / "analysis.ipynb").write_text("{}")
    locked = tmp_path / "locked"
    cases = {"": "output folder '' is empty; give a folder path",
             "/proc/oomlab-test/out": "cannot write the output folder /proc/oomlab-test/out (No such file or",
             str(users): f"output folder {users} holds notebooks/analysis.ipynb, which no oomlab run wrote",
             str(locked): f"another oomlab run (pid {os.getpid()}) is writing to {locked}: it holds the lock"
                          f" {tmp_path / '.locked.lock'}; "}
    with runner.out_dir_lock(locked):
        for out, start in cases.items():
            with cli_run(root, "--out", out) as proc:
                stdout, stderr = proc.communicate(timeout=120)
            assert (proc.returncode, stdout) == (2, ""), stderr
            assert stderr.startswith(f"python -m oomlab run: error: {start}") and stderr.count("\n") == 1, stderr
    assert (users / "notebooks" / "analysis.ipynb").read_text() == "{}"


def test_cli_ctrl_c_says_where_the_partial_run_is(tmp_path: Path) -> None:
    """SIGINT to the whole process group (a terminal's Ctrl-C) in the second notebook: exactly one line on stderr,
    exit 130, no traceback, out_dir never created."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "notebooks").mkdir(parents=True)
    make_notebook(root / "notebooks" / "01_fast.ipynb", "Fast", [])
    make_notebook(root / "notebooks" / "02_slow.ipynb", "Slow", ["import time\ntime.sleep(300)"])
    with cli_run(root, "--out", str(out), start_new_session=True) as proc:
        assert proc.stdout.readline().startswith("01_fast.ipynb ")
        time.sleep(3)  # into the second notebook's kernel start or its sleeping cell
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stdout) == (130, "")
    assert stderr == f"interrupted; outputs unchanged, partial run in {tmp_path / '.out.failed'}\n"
    assert not out.exists() and beside(out) == [".out.failed"]


def test_cli_dead_kernel_reported_once(tmp_path: Path) -> None:
    """A kernel that dies mid-cell (as Ctrl-C reaching the kernel can make it): the runner's one error line, not
    nbclient's own "Kernel died while waiting for execute reply." log record on the terminal (kept in the kernel's
    log, with the failed run)."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "notebooks").mkdir(parents=True)
    make_notebook(root / "notebooks" / "01_dies.ipynb", "Dies", ["import os, signal\nos.kill(os.getpid(), "
                                                                 "signal.SIGKILL)"])
    with cli_run(root, "--out", str(out)) as proc:
        stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1, stderr
    assert "Kernel died while waiting" not in stderr, stderr
    assert "DeadKernelError" in stderr, stderr
