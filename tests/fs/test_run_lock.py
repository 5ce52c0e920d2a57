"""One writer per folder: a live holder refuses, a gone one (a killed process, an earlier run of a requeued
Slurm job) is taken over and said so, a holder on another host is refused with the file to delete; the lock
is given back whole, with the folder it had to create."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest

from widenet_ds.fs.disk_space import DiskFullError
from widenet_ds.fs.run_lock import (
    LOCK_FILE,
    FolderLockedError,
    Holder,
    _command_line,
    _process_start,
    folder_lock,
    output_lock,
    read_holder,
)


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def lock_of(pid: int, tmp_path, **changes) -> Holder:
    holder = Holder(socket.gethostname(), pid, "2026-01-01 00:00:00", "python -m widenet_ds.train pretrain",
                    _process_start(pid))
    return replace(holder, **changes)


def write_lock(folder, holder: Holder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps(asdict(holder)))


def test_a_second_writer_is_refused_naming_the_holder_and_the_lock_is_given_back(tmp_path):
    out = tmp_path / "new" / "run"
    with folder_lock(out, "widenet-ds prepare-data") as lock:
        holder = read_holder(out / LOCK_FILE)
        assert holder.pid == os.getpid() and holder.host == socket.gethostname()
        assert holder.command.startswith("widenet-ds prepare-data")
        assert lock.holder_problem() is not None
        with pytest.raises(FolderLockedError, match=rf"{out} is being written by another process: PID {os.getpid()} "
                                                    rf"on {socket.gethostname()}.*widenet-ds prepare-data"):
            folder_lock(out, "widenet-ds prepare-data").acquire()
    assert not out.exists()  # created for the lock only, by a run that wrote nothing
    out.mkdir(parents=True)
    with folder_lock(out, "x"):
        (out / "kept").write_text("a file of the run")
    assert sorted(p.name for p in out.iterdir()) == ["kept"]


def test_a_live_process_of_this_host_holds_the_lock(tmp_path):
    proc = sleeper()
    try:
        write_lock(tmp_path, lock_of(proc.pid, tmp_path))
        with pytest.raises(FolderLockedError, match=rf"PID {proc.pid} on .*wait for that one to end"):
            folder_lock(tmp_path, "x").acquire()
        assert (tmp_path / LOCK_FILE).is_file()
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_of_a_killed_process_is_taken_over_with_a_message(tmp_path):
    proc = sleeper()
    holder = lock_of(proc.pid, tmp_path)
    proc.kill()
    proc.wait()
    write_lock(tmp_path, holder)
    lock = folder_lock(tmp_path, "x").acquire()
    assert read_holder(tmp_path / LOCK_FILE).pid == os.getpid()
    assert f"its holder, PID {proc.pid}" in lock.takeover_message and "no longer runs" in lock.takeover_message
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_reused_pid_does_not_keep_a_dead_holder_alive(tmp_path):
    # this very process, but started at another time: the PID was reused after the holder died
    holder = lock_of(os.getpid(), tmp_path, process_start=lock_of(os.getpid(), tmp_path).process_start - 1)
    write_lock(tmp_path, holder)
    assert folder_lock(tmp_path, "x").acquire().took_over == holder


def test_a_holder_on_another_host_cannot_be_checked_and_says_which_file_to_delete(tmp_path):
    write_lock(tmp_path, lock_of(1, tmp_path, host="node-elsewhere"))
    with pytest.raises(FolderLockedError, match=rf"another host \(node-elsewhere\).*delete {tmp_path / LOCK_FILE}"):
        folder_lock(tmp_path, "x").acquire()


def test_an_earlier_run_of_the_same_requeued_slurm_job_is_gone_on_any_host(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    write_lock(tmp_path, lock_of(1, tmp_path, host="node-elsewhere", slurm_job="4242.0"))
    assert folder_lock(tmp_path, "x").acquire().took_over is not None
    write_lock(tmp_path / "other", lock_of(1, tmp_path, host="node-elsewhere", slurm_job="777.0"))
    with pytest.raises(FolderLockedError):
        folder_lock(tmp_path / "other", "x").acquire()


def test_a_folder_built_elsewhere_and_moved_in_is_locked_beside_it(tmp_path):
    target = tmp_path / "export"
    with output_lock(target, "widenet-ds convert to-folder"):
        assert (tmp_path / f".export{LOCK_FILE}").is_file() and not target.exists()
        with pytest.raises(FolderLockedError, match=rf"{target} is being written"):
            output_lock(target, "widenet-ds convert to-folder").acquire()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, what, expected", [
    (["train.py", "classify", "--seed", "3"], "python -m widenet_ds.train classify",
     "python -m widenet_ds.train classify --seed 3"),  # the task named once, though it is argv[1] too
    (["widenet-ds", "prepare-data", "--source", "a.txt"], "widenet-ds prepare-data",
     "widenet-ds prepare-data --source a.txt"),
    (["study.py", "--output", "x"], "python -m widenet_ds.train pretrain",
     "python -m widenet_ds.train pretrain --output x")])
def test_the_holder_command_names_the_task_once(monkeypatch, argv, what, expected):
    monkeypatch.setattr(sys, "argv", argv)
    assert _command_line(what) == expected


def test_a_lock_that_a_full_disk_kept_from_being_written_is_removed_and_the_retry_takes_it_at_once(small_disk):
    disk = small_disk("64k")
    filler = small_disk.fill(disk)
    out = disk / "run"
    with pytest.raises(DiskFullError, match=rf"no space left on the disk holding {out} to write its lock file "
                                            rf"{out / LOCK_FILE} \(No space left on device\); nothing was written\. "
                                            rf"Free space there"):
        folder_lock(out, "widenet-ds prepare-data").acquire()
    assert not out.exists()  # neither the empty lock file nor the folder made for it
    filler.unlink()  # the user frees space and starts again at once: no 10-s wait for an abandoned lock
    start = time.monotonic()
    with folder_lock(out, "widenet-ds prepare-data"):
        assert read_holder(out / LOCK_FILE).pid == os.getpid()
    assert time.monotonic() - start < 1


def test_a_garbage_lock_file_is_taken_over_with_a_message(tmp_path):
    """A lock file naming no holder (damaged, or left empty by a writer killed between creating and writing it),
    older than the moment a writer takes: removed, and said."""
    (tmp_path / LOCK_FILE).write_bytes(b"\x00garbage{")
    old = time.time() - 60
    os.utime(tmp_path / LOCK_FILE, (old, old))
    lock = folder_lock(tmp_path, "x").acquire()
    assert read_holder(tmp_path / LOCK_FILE).pid == os.getpid()
    assert lock.takeover_message.startswith(f"took over the lock of {tmp_path}: its lock file {tmp_path / LOCK_FILE} "
                                            f"named no holder (it held b'\\x00garbage{{', last written 6")
    lock.release()
