"""Free space before a write, and a disk filling up during one, on a real small file system: one clear error
naming the folder and the space, nothing half-written left by the atomic writers."""

from __future__ import annotations

import errno
import os

import pytest

from widenet_ds.fs.atomic import atomic_write_bytes
from widenet_ds.fs.disk_space import (
    DiskFullError,
    check_free_space,
    disk_full_errors,
    free_bytes,
    full_disk_message,
    is_disk_full,
)


def test_a_write_that_cannot_fit_is_refused_before_anything_is_written(small_disk):
    disk = small_disk("4m")
    target = disk / "not" / "yet"
    assert 0 < free_bytes(target) <= 4 << 20  # the nearest existing folder's file system
    with pytest.raises(DiskFullError, match=rf"not enough space in {target} for the shards: about 4.1 MiB needed, "
                                            rf"4.0 MiB free; nothing was written\. Free space"):
        check_free_space(target, 3 << 20, "the shards", "Free space.")
    check_free_space(target, 2 << 20, "a smaller file", "")  # fits, with the margin
    assert list(disk.iterdir()) == []


def test_a_disk_filling_up_mid_write_is_one_error_and_leaves_no_partial_file(small_disk):
    disk = small_disk("256k")
    with pytest.raises(DiskFullError, match=rf"the disk holding {disk} filled up while writing the export .*about "
                                            rf"1.5 MiB needed, 0.\d MiB free now\); what was half written is removed\. Free space"):
        with disk_full_errors(disk, 1 << 19, "the export", "Free space."):
            atomic_write_bytes(disk / "big.bin", os.urandom(1 << 19))
    assert list(disk.iterdir()) == []  # the atomic writer removed its temporary file


def test_full_disks_are_recognised_from_what_the_libraries_say():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # torch's zip writer drops the errno
    assert is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 8128 vs 8022"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise ValueError("serialising failed") from inner
    except ValueError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    message = full_disk_message(OSError(errno.ENOSPC, "No space left on device", "/run/metrics.jsonl"))
    assert "no space left on the device while writing /run/metrics.jsonl" in message and "--resume" in message
    assert full_disk_message(OSError(errno.EACCES, "Permission denied")) is None
