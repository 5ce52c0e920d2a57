"""All-or-nothing writers: a writer that fails leaves the earlier file or folder as it was and no temporary
behind; a finished one replaces it whole, with the permissions a plain open() would give."""

from __future__ import annotations

import json
import os
import stat

import pytest

from widenet_ds.errors import CheckpointError
from widenet_ds.fs.atomic import atomic_folder, atomic_write, atomic_write_json


def test_a_failed_write_keeps_the_earlier_file_and_leaves_no_temporary(tmp_path):
    path = atomic_write_json(tmp_path / "results.json", {"step": 1})

    def fail_half_way(handle):
        handle.write(b'{"step": 2, "half')
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, fail_half_way)
    assert json.loads(path.read_text()) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    atomic_write_json(path, {"step": 2})
    assert json.loads(path.read_text()) == {"step": 2}
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_a_folder_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "export"
    with pytest.raises(RuntimeError):
        with atomic_folder(target) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("interrupted before the weights")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary
    with atomic_folder(target) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    with pytest.raises(CheckpointError, match="already exists; choose another output or pass --overwrite"):
        with atomic_folder(target, error=CheckpointError):
            pass
    with atomic_folder(target, overwrite=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"newer")
    assert (target / "model.safetensors").read_bytes() == b"newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
