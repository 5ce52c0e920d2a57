"""Free space, checked before a big write, and a full disk during one turned into one clear error.

Without this a full disk shows up as whatever the writing library says -- torch's zip writer reports
"[enforce fail at inline_container.cc:672] . unexpected pos 8128 vs 8022", safetensors a SafetensorError --
after the work that produced the data, and leaves half a file behind. Writers check the free space against
what they are about to write (`check_free_space`) and turn a full disk met anyway (another program filled
it meanwhile, the estimate was short) into a `DiskFullError` naming the folder and the space needed
(`disk_full_errors`); removing what was half written stays the writer's job.
"""

from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from widenet_ds.errors import WideNetError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What libraries that drop the errno say instead (torch's zip writer says only "unexpected pos").
FULL_MESSAGES = ("No space left on device", "Disk quota exceeded", "StorageFull", "unexpected pos")
MARGIN = 1.05  # file-system blocks and metadata on top of the bytes written
SLACK_BYTES = 1 << 20


class DiskFullError(WideNetError, OSError):
    """Not enough space for a write; nothing half-written was left."""


def mib(size: float) -> str:
    return f"{size / 2**20:,.1f} MiB" if size < 2**30 else f"{size / 2**30:,.2f} GiB"


def free_bytes(path: Path) -> int:
    """Free space of the file system that holds `path` (or would: its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def needed_bytes(payload: int) -> int:
    """The free space a write of `payload` bytes asks for."""
    return int(payload * MARGIN) + SLACK_BYTES


def check_free_space(folder: Path, payload: int, what: str, fix: str) -> None:
    """Refuse to start writing `what` (about `payload` bytes) into `folder` when it cannot fit."""
    needed, free = needed_bytes(payload), free_bytes(folder)
    if free < needed:
        raise DiskFullError(f"not enough space in {folder} for {what}: about {mib(needed)} needed, {mib(free)} "
                            f"free; nothing was written. {fix}")


def is_disk_full(err: BaseException, folder: Path | None = None) -> bool:
    """Whether `err` (or an error it was raised from) says the disk or the quota is full -- or, where the
    library said only that a write failed (torch: "file write failed"), whether `folder`'s disk is full now."""
    if folder is not None and free_bytes(folder) < SLACK_BYTES:
        return True
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if getattr(err, "errno", None) in FULL_ERRNOS or any(text in str(err) for text in FULL_MESSAGES):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextmanager
def disk_full_errors(folder: Path, payload: int, what: str, fix: str) -> Iterator[None]:
    """Turn a full disk met while writing `what` into `folder` into one DiskFullError."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as err:
        if not is_disk_full(err, folder):
            raise
        raise DiskFullError(f"the disk holding {folder} filled up while writing {what} (about "
                            f"{mib(needed_bytes(payload))} needed, {mib(free_bytes(folder))} free now); what was "
                            f"half written is removed. {fix}") from None


def full_disk_message(err: BaseException) -> str | None:
    """The one-line error for a full disk met by a write no writer above foresaw (a log line, a results
    file); None when `err` is not about a full disk."""
    if isinstance(err, DiskFullError) or not is_disk_full(err):
        return None
    where = getattr(err, "filename", None)
    return (f"no space left on the device{f' while writing {where}' if where else ''} ({err}); free space there "
            f"and run the command again (a training run continues from its last checkpoint with --resume).")
