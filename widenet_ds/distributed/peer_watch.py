"""A rank watches its peers while it waits for them: which rank stopped answering, and a stop signal obeyed even
inside a collective.

Two things a rank cannot do by itself while its main thread waits in a collective (gloo's wait releases the GIL
but runs no Python): a SIGTERM's Python handler runs only once the collective returns, so a rank whose peer is
stopped (SIGSTOP, a frozen VM) or vanished (its node powered off, its link cut: no connection reset arrives)
ignored SIGTERM until the process-group timeout; and when that timeout fires, gloo says only "Timed out waiting
300000ms for recv operation", not which rank is missing. Seen on the 2-node test cluster
(tests/integration/test_two_nodes.py), as PyTorch's elastic agent and its flight recorder address them:

  - every rank beats a counter in the rendezvous store (the TCPStore rank 0 serves, through a connection of its
    own) every BEAT_S seconds, from a daemon thread that runs while the main thread waits;
  - the thread looks at the main thread's stack once a second: waiting in one `torch.distributed` call for
    SUSPECT_S seconds, it reads the peers' counters; a counter that has not moved for STALE_S seconds is a rank
    that has ended, is stopped or is cut off (rank 0 not answering at all: its store is gone with it);
  - a stop signal (SIGTERM, SIGUSR1) reaches the thread through `signal.set_wakeup_fd` even while the main thread
    waits: if it waits in a collective for a rank that stopped answering, no checkpoint can be agreed on, and
    the rank ends at once (status 1) with one line naming that rank, its node, the collective and the checkpoint
    to resume from. With live peers the signal takes its usual path (the step ends, every rank saves, exit 0);
  - without a signal, a rank whose peer has not answered for LOST_S seconds of one wait ends the same way: a node
    that vanished leaves every launcher waiting (`mpiexec` for its ssh to that node, `srun` for Slurm to declare
    the node dead), and the rank's own end is what ends the run there (under MPI through MPI_Abort:
    distributed/launch_env.py). A live peer beats from its own thread whatever its main thread computes (torch's
    kernels and collectives release the GIL), so LOST_S is many beats; a shorter `--train-timeout` ends the wait
    first;
  - `stalled_peers()` names the rank that stopped answering, for the line of a collective that timed out
    (distributed/lost_peer.py).

One watch per process (the wakeup descriptor and the main thread are process-wide): `watch_peers` starts it after
the process group is up, `stop_watching` ends it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType

import torch.distributed as torch_dist

from widenet_ds.distributed.every_rank import describe_ranks, rank_hosts
from widenet_ds.distributed.launch_env import abort_mpi_job
from widenet_ds.distributed.lost_peer import name_silent_peers_with, resume_advice

BEAT_S = 2.0  # each rank's heartbeat
SUSPECT_S = 5.0  # a collective waiting this long: the peers' heartbeats are read
STALE_S = 20.0  # a heartbeat that has not moved this long: that rank has ended, is stopped or cut off
LOST_S = 60.0  # ... and this long, without a signal: the run cannot go on (30 beats of a live peer)
STORE_TIMEOUT_S = 10.0  # a store operation; rank 0 (the store's server) not answering this long counts as silent
POLL_S = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
KEY = "widenet-ds/heartbeat/{rank}"
C10D = os.sep + os.path.join("torch", "distributed") + os.sep


@dataclass(frozen=True)
class Wait:
    """Where the main thread waits: the collective and the first caller of ours (or DeepSpeed's) above it."""

    collective: str
    caller: str
    since: float


def collective_of(frame: FrameType | None) -> tuple[str, str] | None:
    """(collective, caller) when `frame`, a thread's innermost one, is inside a `torch.distributed` call: the
    outermost function of torch/distributed/ (`all_gather_object`, not the `all_gather` it calls) and the frame
    that called it (`widenet_ds/training/preemption.py:42`)."""
    if frame is None or C10D not in frame.f_code.co_filename:
        return None
    name = frame.f_code.co_name
    while frame is not None and C10D in frame.f_code.co_filename:
        if frame.f_code.co_filename.endswith("distributed_c10d.py"):
            name = frame.f_code.co_name
        frame = frame.f_back
    caller = "?"
    while frame is not None:
        path = frame.f_code.co_filename
        if f"{os.sep}deepspeed{os.sep}comm{os.sep}" not in path:
            parts = Path(path).parts
            shown = next((Path(*parts[i:]) for i in range(len(parts)) if parts[i] in ("widenet_ds", "deepspeed")),
                         Path(path).name)
            caller = f"{shown}:{frame.f_lineno} ({frame.f_code.co_name})"
            break
        frame = frame.f_back
    return name, caller


class PeerWatch:
    """The watch of one rank (see the module docstring)."""

    def __init__(self, rank: int, hosts: list[str], address: tuple[str, int], checkpoints: Path | None,
                 program: str) -> None:
        self.rank, self.hosts, self.address = rank, hosts, address
        self.checkpoints, self.program = checkpoints, program
        self.stop_signal: str | None = None
        self._main = threading.main_thread().ident
        self._wait: Wait | None = None
        self._frame: FrameType | None = None  # held, so that a new frame cannot take its address (identity check)
        self._watched: Wait | None = None  # the long wait whose peers are followed
        self._seen: dict[int, tuple[int | None, float]] = {}  # rank -> (its counter, when it last moved)
        self._store = None
        self._store_lost = False
        self._closed = threading.Event()
        self._read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._write_fd = write_fd
        self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._run, name="widenet-peer-watch", daemon=True)
        self._thread.start()

    # -- the thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        next_beat = 0.0
        while not self._closed.is_set():
            ready, _, _ = select.select([self._read_fd], [], [], POLL_S)
            if ready:
                self._read_signals()
            now = time.monotonic()
            if self._closed.is_set():
                break
            if now >= next_beat:
                self._beat()
                next_beat = now + BEAT_S
            wait = self._main_wait(now)
            if wait is None or now - wait.since < SUSPECT_S:
                continue
            if wait is not self._watched:  # a new long wait: the peers' counters are followed from now on
                self._watched, self._seen = wait, {}
            self._follow_peers(now)
            silent = self.silent_for(STALE_S, now)
            if self._closed.is_set():
                break
            if self.stop_signal is not None and silent:
                self._end(wait, silent, now, f"got {self.stop_signal} while waiting", STALE_S)
            if lost := self.silent_for(LOST_S, now):
                self._end(wait, lost, now, "waited", LOST_S)

    def _read_signals(self) -> None:
        with contextlib.suppress(OSError):
            for number in os.read(self._read_fd, 64):
                if number in {int(s) for s in STOP_SIGNALS}:
                    self.stop_signal = self.stop_signal or signal.Signals(number).name

    def _store_add(self, rank: int, amount: int) -> int:
        """The store's `add` on a rank's counter. Once the store has failed (rank 0's process, which serves it, ended,
        stopped or is cut off), it is not asked again: each failure costs a timeout and a warning from torch."""
        if self._store_lost:
            raise ConnectionError("the rendezvous store does not answer")
        try:
            if self._store is None:
                self._store = torch_dist.TCPStore(self.address[0], self.address[1], is_master=False,
                                                  timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)
            return self._store.add(KEY.format(rank=rank), amount)
        except Exception:
            self._store_lost = True
            raise

    def _beat(self) -> None:
        with contextlib.suppress(Exception):  # the store silent: rank 0 is what the others miss
            self._store_add(self.rank, 1)

    def _main_wait(self, now: float) -> Wait | None:
        frame = sys._current_frames().get(self._main)
        found = collective_of(frame)
        if found is None:
            self._wait = self._frame = None
            return None
        if frame is not self._frame or self._wait is None:
            self._frame, self._wait = frame, Wait(*found, since=now)
        return self._wait

    def _follow_peers(self, now: float) -> None:
        """Read every peer's counter; one that moved is marked with `now`. The store not answering (rank 0 serves
        it): rank 0's counter stands still, and the others' are not known, so not held against them."""
        peers = [rank for rank in range(len(self.hosts)) if rank != self.rank]
        try:
            values: dict[int, int | None] = {rank: self._store_add(rank, 0) for rank in peers}
            unknown = set()
        except Exception:
            values, unknown = {}, {rank for rank in peers if rank != 0}
        seen = dict(self._seen)  # replaced, not changed: the main thread may read it (silent_for)
        for rank in peers:
            last = seen.get(rank)
            value = values.get(rank, last[0] if last else None)
            if last is None or rank in unknown or value != last[0]:
                seen[rank] = (value, now)
        self._seen = seen

    def silent_for(self, seconds: float, now: float | None = None) -> list[int]:
        """The peers whose counter has not moved for `seconds` of the current long wait."""
        now = time.monotonic() if now is None else now
        return sorted(rank for rank, (_, moved) in self._seen.items() if now - moved >= seconds)

    def _end(self, wait: Wait, silent: list[int], now: float, what: str, silence: float) -> None:
        message = (f"rank {self.rank} on {socket.gethostname()} {what} {now - wait.since:.0f} s in {wait.collective} "
                   f"(called from {wait.caller}) for {describe_ranks(silent, self.hosts)}, which has not answered for "
                   f"{silence:.0f} s or more: its process or node has ended, is stopped or is cut off, so no checkpoint "
                   f"can be agreed on now. The run stopped; {resume_advice(self.checkpoints)}.")
        try:  # the console may have gone with the peer (a node's ssh session): the rank ends all the same
            print(f"{self.program}: error: {message}", file=sys.stderr, flush=True)
            sys.stdout.flush()
        finally:
            abort_mpi_job(1)
            os._exit(1)

    # -- for the main thread --------------------------------------------------------------------------
    def describe(self, ranks: list[int]) -> str:
        """`rank 1 on node2`, `ranks 8, 9 on node2 and rank 16 on node3`."""
        by_host: dict[str, list[int]] = {}
        for rank in sorted(ranks):
            by_host.setdefault(self.hosts[rank] if rank < len(self.hosts) else "?", []).append(rank)
        parts = [f"rank{'s' if len(group) > 1 else ''} {', '.join(map(str, group))} on {host}"
                 for host, group in by_host.items()]
        return " and ".join(parts)

    def close(self) -> None:
        self._closed.set()
        signal.set_wakeup_fd(self._previous_fd)
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")  # wakes the thread from its select at once
        self._thread.join(timeout=STORE_TIMEOUT_S + 2 * POLL_S)
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


_WATCH: list[PeerWatch] = []  # this process's watch, when one runs
_SILENT_AT_CLOSE: list[str] = []  # what the last watch had seen when it was stopped (the error ends the run after it)


def watch_peers(checkpoints: Path | None, program: str) -> None:
    """Collective (every rank's host name is gathered): start this rank's watch; nothing on a single rank."""
    if not torch_dist.is_initialized() or torch_dist.get_world_size() == 1 or _WATCH:
        return
    hosts = rank_hosts()
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    _SILENT_AT_CLOSE.clear()
    _WATCH.append(PeerWatch(torch_dist.get_rank(), hosts, address, checkpoints, program))
    name_silent_peers_with(stalled_peers)


def stop_watching() -> None:
    while _WATCH:
        watch = _WATCH.pop()
        silent = watch.silent_for(3 * BEAT_S)
        _SILENT_AT_CLOSE[:] = [describe_ranks(silent, watch.hosts)] if silent else []
        watch.close()


def stalled_peers() -> str | None:
    """`rank 1 on node2` when, in the wait that just failed, this rank's watch saw a peer's heartbeat stand still
    for 3 beats or more (also once the watch was stopped, as the error left the run), else None."""
    if _WATCH:
        silent = _WATCH[0].silent_for(3 * BEAT_S)
        return describe_ranks(silent, _WATCH[0].hosts) if silent else None
    return _SILENT_AT_CLOSE[0] if _SILENT_AT_CLOSE else None
