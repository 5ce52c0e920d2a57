"""The test harness removes JIT-build locks that no real build can still hold, and only those."""

from __future__ import annotations

import os
import time

import pytest
from tests.support.launching import STALE_LOCK_SECONDS, clear_stale_build_locks


@pytest.mark.parametrize("tag", [("py311_cpu",), ()], ids=["default-cache-layout", "TORCH_EXTENSIONS_DIR-layout"])
def test_only_locks_older_than_any_build_are_removed(tmp_path, monkeypatch, tag):
    # torch builds into <dir>/<py tag>/<op> by default, straight into <dir>/<op> when TORCH_EXTENSIONS_DIR is set
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old, fresh = tmp_path.joinpath(*tag, "deepspeed_shm_comm", "lock"), tmp_path.joinpath(*tag, "other", "lock")
    for lock in (old, fresh):
        lock.parent.mkdir(parents=True)
        lock.touch()
    past = time.time() - STALE_LOCK_SECONDS - 10
    os.utime(old, (past, past))
    assert clear_stale_build_locks() == [old]
    assert not old.exists() and fresh.exists()
