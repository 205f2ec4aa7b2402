"""write_configs never overwrites a file oomlab did not write (issue 20): an existing file as the folder, or a folder
holding a file of a launch file's name with other contents, is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlab.core.errors import InvalidValueError
from oomlab.remedies import launch_writer
from oomlab.remedies.launch_files import LAUNCH_DOC, TRAIN_SCRIPT


def test_existing_file_refused(tmp_path: Path) -> None:
    """A file given as the folder is refused naming it, and left as it was (overwritten before)."""
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    with pytest.raises(InvalidValueError) as err:
        launch_writer.write_configs(target)
    assert str(err.value) == (f"launch folder {str(target)!r} is an existing file, not a folder: oomlab never "
                              "overwrites a file it did not write; give a new folder, or one oomlab wrote")
    assert target.read_text() == "mine"


def test_folder_with_a_users_file_refused(tmp_path: Path) -> None:
    """A folder holding the user's own train.py is refused naming it; nothing in the folder is written."""
    (tmp_path / TRAIN_SCRIPT).write_text("# my training script\n")
    with pytest.raises(InvalidValueError) as err:
        launch_writer.write_configs(tmp_path)
    assert f"launch folder {str(tmp_path)!r} already holds {TRAIN_SCRIPT}, which oomlab would write with other " \
           "contents: oomlab never overwrites files it did not write" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [TRAIN_SCRIPT]
    assert (tmp_path / TRAIN_SCRIPT).read_text() == "# my training script\n"


def test_folder_oomlab_wrote_is_written_again(tmp_path: Path) -> None:
    """The same files again (byte-identical) are accepted: a second run into the same folder works, unchanged."""
    first = launch_writer.write_configs(tmp_path)
    before = {name: path.read_bytes() for name, path in first.items()}
    second = launch_writer.write_configs(tmp_path)
    assert second == first and {name: path.read_bytes() for name, path in second.items()} == before


def test_other_files_in_the_folder_are_left_alone(tmp_path: Path) -> None:
    """Files of names oomlab does not write do not stop it and stay as they are."""
    (tmp_path / "README.txt").write_text("mine")
    written = launch_writer.write_configs(tmp_path)
    assert LAUNCH_DOC in written and (tmp_path / "README.txt").read_text() == "mine"


def test_a_folder_where_a_file_goes_is_refused(tmp_path: Path) -> None:
    """A folder named like a launch file is a clash too (os.replace would fail half-way before)."""
    (tmp_path / LAUNCH_DOC).mkdir()
    with pytest.raises(InvalidValueError, match=f"already holds {LAUNCH_DOC}, which oomlab would write"):
        launch_writer.write_configs(tmp_path)
