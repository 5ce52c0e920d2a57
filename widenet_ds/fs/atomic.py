"""All-or-nothing writes: a crash (or a kill) never leaves a half-written file or folder behind.

Files are written to a temporary name in the same folder and moved over the target with `os.replace`,
which is atomic on POSIX file systems; folders are built under a temporary name and renamed at the end.
Every writer of results, configs, manifests, shards, checkpoints' markers and exported folders uses these.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from widenet_ds.errors import WideNetError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once: the process's umask, so atomically written files get the permissions a plain open() gives
# (mkstemp creates them 0600, which would make data folders and exports unreadable to a group).
_FILE_MODE = 0o666 & ~_umask()


def set_default_permissions(path: str | os.PathLike) -> None:
    """Give a file written by a library that creates 0600 files (mkstemp, safetensors) the usual mode."""
    os.chmod(path, _FILE_MODE)


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Call `write(handle)` on a temporary file beside `path`, then move it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as handle:
            write(handle)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda handle: handle.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda handle: handle.write(text), mode="w")


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int = 2, sort_keys: bool = False) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False) + "\n")


@contextmanager
def atomic_folder(target: str | os.PathLike, overwrite: bool = False,
                  error: type[WideNetError] = WideNetError) -> Iterator[Path]:
    """Yield `<target>.tmp-<pid>` to write into; move it to `target` only when the block completes."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise error(f"{target} already exists; choose another output or pass --overwrite.")
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        old = target.with_name(f"{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old)
    else:
        os.replace(tmp, target)
