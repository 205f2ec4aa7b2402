"""Tests for oomlab.pipeline.ownership: the run manifest, what it vouches for, and the output folder's lock."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oomlab.core.errors import OutputFolderError
from oomlab.pipeline.ownership import (
    MANIFEST_NAME,
    Foreign,
    RunFile,
    RunManifest,
    foreign_path,
    lock_path,
    manifest_of,
    oomlab_version,
    out_dir_lock,
    read_manifest,
    unwritable,
    write_manifest,
)

ENTRIES = ["notebooks", "results", "configs", "report.html"]
ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2's "abc"
NOT_LISTED = f"which the last run did not write ({MANIFEST_NAME} does not list it)"
CHANGED = f"changed since oomlab wrote it (its SHA-256 differs from {MANIFEST_NAME}'s)"
# A process that takes the lock the way a run does, says so, and holds it until its stdin closes.
HOLDER = ("import sys; from pathlib import Path; from oomlab.pipeline.ownership import out_dir_lock\n"
          "with out_dir_lock(Path(sys.argv[1])):\n    print('locked', flush=True); sys.stdin.read()")


def a_run(out: Path) -> Path:
    """``out`` holding a small run of oomlab's and its manifest."""
    (out / "notebooks").mkdir(parents=True)
    (out / "notebooks" / "01_a.ipynb").write_text("{}")
    (out / "results").mkdir()
    (out / "results" / "01_a.json").write_bytes(b"abc")
    (out / "report.html").write_text("<html></html>")
    write_manifest(out, manifest_of(out, ENTRIES))
    return out


def foreign(out: Path) -> Foreign | None:
    manifest, missing = read_manifest(out)
    return foreign_path(out, ENTRIES, manifest, missing)


# ------------------------------------------------------------------------------------------------ manifest


def test_manifest_lists_every_folder_and_file_with_its_sha256_and_size(tmp_path: Path) -> None:
    """Folders and files under the entries, parents first, names sorted; absent entries skipped."""
    manifest = manifest_of(a_run(tmp_path / "out"), ENTRIES)
    assert manifest.folders == ("notebooks", "results")
    assert [f.path for f in manifest.files] == ["notebooks/01_a.ipynb", "results/01_a.json", "report.html"]
    assert manifest.files[1] == RunFile("results/01_a.json", ABC_SHA256, 3)
    assert manifest.oomlab_version == oomlab_version() == "0.1.0"


def test_manifest_round_trips_through_its_file(tmp_path: Path) -> None:
    """What write_manifest writes, read_manifest reads back equal, with its format marker."""
    out = a_run(tmp_path / "out")
    raw = json.loads((out / MANIFEST_NAME).read_text())
    assert raw["format"] == "oomlab-run-manifest/1" and raw["oomlab_version"] == "0.1.0"
    assert raw["files"][1] == {"path": "results/01_a.json", "sha256": ABC_SHA256, "size_bytes": 3}
    assert read_manifest(out) == (manifest_of(out, ENTRIES), "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"files": []}', 'not a run manifest (no "format": "oomlab-run-manifest/1")'),  # someone else's JSON
        ('{"format": "oomlab-run-manifest/1", "folders": [], "files": [{"path": "a"}]}',
         '"files" is not a list of {path, sha256, size_bytes}'),
        ('{"format": "oomlab-run-manifest/1", "folders": "results", "files": []}', '"folders" is not a list of paths'),
        ('{"format": "oomlab-run-manifest/1", "folders": [], "files": [{"path": "a", "sha256": "0",'
         ' "size_bytes": -1}]}', '"files" is not a list of {path, sha256, size_bytes}'),  # a negative size
    ],
)
def test_a_manifest_not_oomlab_s_is_no_manifest(tmp_path: Path, text: str, reason: str) -> None:
    """A manifest without the marker or with malformed rows vouches for nothing, and says why."""
    (tmp_path / MANIFEST_NAME).write_text(text)
    assert read_manifest(tmp_path) == (None, f"{MANIFEST_NAME} cannot be read: {reason}")


def test_no_manifest_says_so(tmp_path: Path) -> None:
    """A folder without a manifest: None and the reason."""
    assert read_manifest(tmp_path) == (None, f"no {MANIFEST_NAME}")


# ------------------------------------------------------------------------------------- what it vouches for


def test_an_untouched_run_may_be_replaced(tmp_path: Path) -> None:
    """Every path listed with its checksum: nothing is foreign; a listed file the user deleted is not either."""
    out = a_run(tmp_path / "out")
    assert foreign(out) is None
    (out / "results" / "01_a.json").unlink()
    assert foreign(out) is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda out: (out / "results" / "important.csv").write_text("mine"),
         Foreign("results/important.csv", "results/", NOT_LISTED)),
        (lambda out: (out / "results" / "01_a.json").write_bytes(b"abd"),  # same size, other bytes
         Foreign("results/01_a.json", "results/", CHANGED)),
        (lambda out: (out / "report.html").write_text("<html>edited</html>"), Foreign("report.html", "report.html",
                                                                                       CHANGED)),
        (lambda out: (out / "configs").mkdir(), Foreign("configs/", "configs/", NOT_LISTED)),  # an empty folder
        (lambda out: (out / "notebooks" / "link").symlink_to(out.parent),
         Foreign("notebooks/link", "notebooks/", "a symbolic link, which oomlab never writes")),
        (lambda out: os.mkfifo(out / "results" / "pipe"),
         Foreign("results/pipe", "results/", "which is not a regular file or folder")),
        (lambda out: (out / MANIFEST_NAME).write_text("{"),  # a broken manifest vouches for nothing
         Foreign("notebooks/01_a.ipynb", "notebooks/", f"which no oomlab run wrote ({MANIFEST_NAME} cannot be read:"
                 " Expecting property name enclosed in double quotes: line 1"
                 " column 2 (char 1))")),
    ],
)
def test_what_the_manifest_does_not_vouch_for_is_named(tmp_path: Path, change, expected: Foreign) -> None:
    """A user's file, a changed one, an unlisted folder, a link, a FIFO, or anything under a broken manifest."""
    out = a_run(tmp_path / "out")
    change(out)
    assert foreign(out) == expected


def test_without_a_manifest_the_first_file_is_named_not_its_folder(tmp_path: Path) -> None:
    """A user's folder: the file they would lose is named; a folder holding only folders is named itself."""
    out = tmp_path / "out"
    (out / "notebooks" / "deep").mkdir(parents=True)
    (out / "notebooks" / "analysis.ipynb").write_text("{}")
    (out / "results" / "empty").mkdir(parents=True)
    no_manifest = f"which no oomlab run wrote (no {MANIFEST_NAME})"
    assert foreign(out) == Foreign("notebooks/analysis.ipynb", "notebooks/", no_manifest)
    assert foreign_path(out, ["results"], None, f"no {MANIFEST_NAME}") == Foreign("results/", "results/",
                                                                                      no_manifest)


def test_the_manifest_itself_is_never_foreign(tmp_path: Path) -> None:
    """The swap replaces the manifest with the run it lists; checking it would refuse every second run."""
    out = a_run(tmp_path / "out")
    assert foreign_path(out, [*ENTRIES, MANIFEST_NAME], *read_manifest(out)) is None


def test_manifest_leaves_out_links_so_a_later_run_refuses_them(tmp_path: Path) -> None:
    """A link a notebook made is not vouched for: the next run names it instead of replacing it."""
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "link").symlink_to(tmp_path)
    manifest = manifest_of(out, ENTRIES)
    assert manifest.folders == ("results",) and manifest.files == ()
    assert foreign_path(out, ENTRIES, manifest) == Foreign("results/link", "results/",
                                                           "a symbolic link, which oomlab never writes")


# ---------------------------------------------------------------------------------------------------- lock


def test_lock_sits_beside_the_folder(tmp_path: Path) -> None:
    """The lock file is ``.<name>.lock`` beside the output folder, never in it."""
    assert lock_path(tmp_path / "out") == tmp_path / ".out.lock"


def test_a_held_lock_refuses_at_once_naming_the_holder(tmp_path: Path) -> None:
    """A second taker, even in the same process, is refused with the lock's path and the holder's pid."""
    out = tmp_path / "out"
    with out_dir_lock(out) as path:
        assert path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(OutputFolderError) as info, out_dir_lock(out):
            pass
    assert str(info.value) == (
        f"another oomlab run (pid {os.getpid()}) is writing to {out}: it holds the lock {tmp_path / '.out.lock'};"
        " nothing was run and nothing changed: wait for it to finish, or choose another --out")
    assert not path.exists()  # released and removed


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    """Another process's lock refuses naming its pid; killed (no clean-up at all), its lock dies with it."""
    out = tmp_path / "out"
    with subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as holder:
        try:
            assert holder.stdout.readline() == "locked\n"
            with pytest.raises(OutputFolderError, match=rf"^another oomlab run \(pid {holder.pid}\) is writing to "):
                with out_dir_lock(out):
                    pass
        finally:
            holder.kill()
    assert lock_path(out).exists()  # SIGKILL: the file stays, its flock does not
    with out_dir_lock(out) as path:
        assert path.read_text() == f"{os.getpid()}\n"


def test_an_unwritable_folder_is_said_plainly() -> None:
    """The refusal names the folder, the system's reason and the path that failed, and says what to do."""
    err = OSError(errno.EROFS, os.strerror(errno.EROFS), "/mnt/ro/.out.lock")
    assert str(unwritable(Path("/mnt/ro/out"), err)) == (
        "cannot write the output folder /mnt/ro/out (Read-only file system: /mnt/ro/.out.lock); nothing was run and"
        " nothing changed: choose another --out, a folder on a filesystem you can write")


def test_manifest_dataclass_is_what_it_reads(tmp_path: Path) -> None:
    """from_dict(to_dict()) is the identity."""
    manifest = RunManifest(None, ("results",), (RunFile("results/a.json", ABC_SHA256, 3),))
    assert RunManifest.from_dict(json.loads(json.dumps(manifest.to_dict()))) == manifest
