"""Output folders checked before anything heavy starts: creatable, not blocked by a file, writable.

Without this a run learns that `--output-dir` is unusable only when it first writes there -- after the
data is read, the model built and DeepSpeed initialised -- and reports it as a raw OSError traceback.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from widenet_ds.errors import ConfigError, WideNetError


def check_output_folder(path: str | os.PathLike, flag: str, subfolders: tuple[str, ...] = (),
                        error: type[WideNetError] = ConfigError) -> None:
    """Refuse `path` (named by `flag`, e.g. "--output-dir") unless it is, or can become, a writable folder.

    Creates nothing: walks up to the nearest existing folder and probes it with a temporary file, which
    is removed at once. `subfolders` that would be created inside (e.g. "checkpoints") must not be files.
    """
    path = Path(path)
    for sub in subfolders:
        inner = path / sub
        if inner.exists() and not inner.is_dir():
            raise error(f"{flag} {path}: {inner} is a file, where the run writes the folder {sub}/; move that "
                        f"file away or choose another {flag}.")
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise error(f"{flag} {path}: {existing} is a broken symbolic link; fix it or choose another {flag}.")
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"cannot be created: {existing} is a file, not a folder"
        raise error(f"{flag} {path} {where}; choose a folder path for {flag}.")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".widenet-write-check.")
    except OSError as err:
        raise error(f"{flag} {path} is not writable ({existing}: {_reason(err)}); choose a folder you can write "
                    f"to, or fix its permissions.") from None
    os.close(fd)
    os.unlink(probe)


def _reason(err: OSError) -> str:
    """Why no file can be created in an existing folder, in words (a virtual file system such as /proc
    answers "No such file or directory", which reads as if the folder were missing)."""
    if err.errno == errno.ENOENT:
        return "no files can be created there: it is on a virtual file system such as /proc or /sys"
    if err.errno == errno.EROFS:
        return "it is on a read-only file system"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return err.strerror or str(err)
