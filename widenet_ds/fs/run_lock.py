"""One writer per folder: a lock file naming its holder (host, PID, start time, command).

Two trainings into one `--output-dir` would each write checkpoints/ and metrics.jsonl and prune each
other's checkpoints; two `prepare-data`, `convert` or `report` runs into one output would mix their files.
Every command that writes a folder takes its lock first and gives it back when it ends:

    with folder_lock(output, "widenet-ds prepare-data"):   # a folder written in place: the lock inside it
        ...
    with output_lock(target, "widenet-ds convert"):        # a folder built elsewhere and moved in: beside it

A second writer is refused with the holder's name. A lock whose holder is gone -- same host and no process
with that PID and start time (a killed run), or an earlier run of the same requeued Slurm job -- is taken
over, and said so. A lock of another host cannot
be checked from here: the error says which file to delete once that run has ended. A multi-rank training
takes the lock on rank 0 only (widenet_ds/run/run_task.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from widenet_ds.errors import WideNetError
from widenet_ds.fs.disk_space import DiskFullError, is_disk_full

LOCK_FILE = ".widenet-ds.lock"


class FolderLockedError(WideNetError):
    """Another process is writing the folder."""


def _process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks after boot (Linux), which tells a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name's ")"


def _slurm_job() -> str | None:
    job = os.environ.get("SLURM_JOB_ID")
    return f"{job}.{os.environ.get('SLURM_RESTART_COUNT', '0')}" if job else None


def _command_line(what: str) -> str:
    """`what` (the command, e.g. "widenet-ds prepare-data") and this process's arguments, for people."""
    args = sys.argv[1:]
    if args and args[0] == what.split()[-1]:  # `python -m widenet_ds.train classify`: the task is argv[1] too
        args = args[1:]
    return " ".join([what, *args])[:300]


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    started: str              # local time, for people
    command: str
    process_start: int | None  # clock ticks after boot (Linux), for telling a reused PID apart
    slurm_job: str | None = None  # "<job id>.<restart count>" inside a Slurm job

    @classmethod
    def this_process(cls, what: str) -> "Holder":
        return cls(socket.gethostname(), os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S"), _command_line(what),
                   _process_start(os.getpid()), _slurm_job())

    def describe(self) -> str:
        return f"PID {self.pid} on {self.host}, started {self.started} (`{self.command}`)"

    def is_gone(self) -> bool:
        """Surely ended: an earlier run of this requeued Slurm job (Slurm runs one at a time, on any node), or
        on this host with no process of its PID and start time left."""
        mine = _slurm_job()
        if mine and self.slurm_job and mine != self.slurm_job and mine.split(".")[0] == self.slurm_job.split(".")[0]:
            return True
        if self.host != socket.gethostname():
            return False  # cannot be checked from here
        if self.process_start is not None and Path("/proc/self/stat").exists():
            return _process_start(self.pid) != self.process_start
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def read_holder(lock_path: Path) -> Holder | None:
    """The holder a lock file names; None when there is no lock file, or one left half-written."""
    try:
        data = json.loads(Path(lock_path).read_text())
        return Holder(**data)
    except (OSError, ValueError, TypeError):  # absent, or being written this moment
        return None


class FolderLock:
    """The lock of `folder` in the file `path`; `acquire` once, `release` at the end (or use `with`)."""

    def __init__(self, path: Path, folder: Path, what: str) -> None:
        self.path, self.folder, self.what = Path(path), Path(folder), what
        self.held = False
        self._created_folder = False
        self.took_over: Holder | None = None  # the gone holder whose lock was taken over
        self.took_unreadable: str | None = None  # what an unreadable lock file held, when it was removed

    def holder_problem(self) -> str | None:
        """The refusal a writer would get now (a live holder), without taking the lock."""
        holder = read_holder(self.path)
        return None if holder is None or holder.is_gone() else self._refusal(holder)

    def _refusal(self, holder: Holder) -> str:
        remote = (f" It runs on another host ({holder.host}), so whether it still runs cannot be checked from "
                  f"here: once it has ended, delete {self.path} and start again." if holder.host != socket.gethostname()
                  else "")
        return (f"{self.folder} is being written by another process: {holder.describe()}. Only one process may "
                f"write a folder at a time: wait for that one to end, or choose another output folder.{remote}")

    def acquire(self) -> "FolderLock":
        self._created_folder = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = json.dumps(asdict(Holder.this_process(self.what)), indent=1) + "\n"
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_holder(self.path)
                if holder is None:
                    self._remove_if_abandoned()
                elif holder.is_gone():
                    self._take_from(holder)
                else:
                    raise FolderLockedError(self._refusal(holder)) from None
                continue
            try:
                with os.fdopen(fd, "w") as handle:
                    handle.write(record)
            except OSError as err:
                # Left empty, the file would keep the next writer out for ~10 s (`_remove_if_abandoned`).
                self.path.unlink(missing_ok=True)
                self._remove_created_folder()
                if not is_disk_full(err):
                    raise
                raise DiskFullError(f"no space left on the disk holding {self.folder} to write its lock file "
                                    f"{self.path} ({err.strerror}); nothing was written. Free space there and run "
                                    f"the command again.") from None
            self.held = True
            return self
        raise FolderLockedError(f"{self.path}: the lock of {self.folder} keeps being taken by other processes; "
                                f"only one process may write a folder at a time.")

    def _take_from(self, holder: Holder) -> None:
        """Remove a gone holder's lock; of two processes doing so at once only one rename succeeds."""
        aside = self.path.with_name(f"{self.path.name}.stale-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return
        aside.unlink(missing_ok=True)
        self.took_over = holder

    def _remove_if_abandoned(self) -> None:
        """A lock file naming no holder: its writer is between creating and writing it (a moment), or died
        there; one older than that moment is removed."""
        try:
            age = time.time() - self.path.stat().st_mtime
            content = self.path.read_bytes()[:40]
        except FileNotFoundError:
            return
        if age > 10:
            self.path.unlink(missing_ok=True)
            self.took_unreadable = (f"{'empty' if not content else f'it held {content!r}'}, last written "
                                    f"{age:.0f} s ago")
        else:
            time.sleep(1)

    @property
    def takeover_message(self) -> str | None:
        if self.took_unreadable is not None:
            return (f"took over the lock of {self.folder}: its lock file {self.path} named no holder "
                    f"({self.took_unreadable}), so no process could be holding it.")
        if self.took_over is None:
            return None
        return (f"took over the lock of {self.folder}: its holder, {self.took_over.describe()}, no longer runs "
                f"(it was stopped before it could give the folder back).")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = read_holder(self.path)
        if holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname():
            self.path.unlink(missing_ok=True)
        self._remove_created_folder()

    def _remove_created_folder(self) -> None:
        if self._created_folder:  # a folder made only to hold the lock of a run that wrote nothing
            try:
                self.path.parent.rmdir()
            except OSError:
                pass

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def folder_lock(folder: Path, what: str) -> FolderLock:
    """The lock of a folder written in place (a run folder, a data folder): a file inside it."""
    return FolderLock(Path(folder) / LOCK_FILE, folder, what)


def output_lock(target: Path, what: str) -> FolderLock:
    """The lock of a folder built under a temporary name and moved into place (`atomic_folder`): a file
    beside it, as the folder itself is replaced whole."""
    target = Path(target)
    return FolderLock(target.with_name(f".{target.name}{LOCK_FILE}"), target, what)
