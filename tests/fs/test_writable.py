"""Output folders checked before anything heavy starts (widenet_ds/fs/writable.py): a folder that can be made is
accepted and nothing is created; a file in the way, a broken link, a folder no file can be made in are refused
with the flag and the reason."""

from __future__ import annotations

import pytest

from widenet_ds.errors import ConfigError, DataError
from widenet_ds.fs.writable import check_output_folder


def test_a_folder_that_can_be_made_is_accepted_and_nothing_is_created(tmp_path):
    check_output_folder(tmp_path / "runs" / "new", "--output-dir", ("checkpoints",))
    check_output_folder(tmp_path, "--output-dir")
    assert list(tmp_path.iterdir()) == []  # not the folders, not the probe file


def test_a_file_in_the_way_is_refused_with_the_flag(tmp_path):
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(ConfigError, match=f"--output-dir {tmp_path / 'notes'} is a file; choose a folder path"):
        check_output_folder(tmp_path / "notes", "--output-dir")
    with pytest.raises(ConfigError, match=f"cannot be created: {tmp_path / 'notes'} is a file, not a folder"):
        check_output_folder(tmp_path / "notes" / "run", "--output")
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("")
    with pytest.raises(ConfigError, match="checkpoints is a file, where the run writes the folder checkpoints/"):
        check_output_folder(run, "--output-dir", ("checkpoints",))
    assert (tmp_path / "notes").read_text() == "mine"


def test_a_broken_link_is_named(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(DataError, match=f"{tmp_path / 'link'} is a broken symbolic link"):
        check_output_folder(tmp_path / "link" / "run", "--output", error=DataError)


def test_a_folder_where_no_file_can_be_made_says_why():
    with pytest.raises(ConfigError, match=r"--output-dir /proc/widenet-run is not writable \(/proc: no files can be "
                                          r"created there: it is on a virtual file system"):
        check_output_folder("/proc/widenet-run", "--output-dir")
