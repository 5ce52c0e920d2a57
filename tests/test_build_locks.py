"""The test harness removes JIT-build locks that no real build can still hold, and only those."""

from __future__ import annotations

import os
import time

from launching import STALE_LOCK_SECONDS, clear_stale_build_locks


def test_only_locks_older_than_any_build_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old, fresh = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock", tmp_path / "py311_cpu" / "other" / "lock"
    for lock in (old, fresh):
        lock.parent.mkdir(parents=True)
        lock.touch()
    past = time.time() - STALE_LOCK_SECONDS - 10
    os.utime(old, (past, past))
    assert clear_stale_build_locks() == [old]
    assert not old.exists() and fresh.exists()
