"""The tags of a checkpoints folder (checkpoint/tags.py): `latest` names a complete tag, and the one resolver from a
tag folder, a checkpoints folder or a run folder to a tag."""

from __future__ import annotations

import pytest

from widenet_ds.checkpoint.tags import latest_checkpoint, resolve_tag_dir
from widenet_ds.errors import CheckpointError

from tests.support.run_folders import make_tag


def test_latest_must_point_at_a_complete_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    make_tag(tmp_path, 5)
    make_tag(tmp_path, 6, complete=False)
    (tmp_path / "latest").write_text("step5")
    assert latest_checkpoint(tmp_path) == tmp_path / "step5"
    assert resolve_tag_dir(tmp_path) == tmp_path / "step5"
    assert resolve_tag_dir(tmp_path / "step5") == tmp_path / "step5"
    assert resolve_tag_dir(tmp_path, "step5") == tmp_path / "step5"
    (tmp_path / "latest").write_text("step6")
    with pytest.raises(CheckpointError, match="not a complete widenet-ds checkpoint"):
        latest_checkpoint(tmp_path)
    # conversion reads DeepSpeed tag folders without our marker; training never does
    assert resolve_tag_dir(tmp_path, require_marker=False) == tmp_path / "step6"
    with pytest.raises(CheckpointError, match="tag 'step7' does not exist"):
        resolve_tag_dir(tmp_path, "step7")
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_tag_dir(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no widenet-ds checkpoint at"):
        resolve_tag_dir(tmp_path / "empty")
