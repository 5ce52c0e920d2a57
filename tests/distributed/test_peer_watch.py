"""Bounded waits on one machine, two real gloo ranks (the cross-node cases: tests/integration/test_two_nodes.py):

- a collective whose peer is stopped (SIGSTOP) ends at the training bound, not torch's 30 minutes, also on a
  group created after the process group (as DeepSpeed's are), and its line names the silent rank and the bound
  (distributed/collective_timeouts.py, distributed/lost_peer.py, distributed/peer_watch.py);
- SIGTERM ends a rank waiting in a collective for a stopped peer, with one line naming the rank, the collective
  and where it was called from; with a live peer the signal waits for the collective, as a preemption's must;
- without a signal, a peer silent for the watch's LOST_S of one wait ends the rank the same way (a vanished node
  leaves mpiexec and srun waiting otherwise);
- a rank whose rank 0 has gone prints no C++ stack of the store's from its heartbeat (torch's C++ warnings off);
- every rank's own problems are one error on every rank, naming the ranks that have them (distributed/every_rank.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.launching import REPO, child_env, free_port
from widenet_ds.distributed.every_rank import describe_ranks
from widenet_ds.distributed.peer_watch import LOST_S

pytestmark = pytest.mark.multirank

# argv: rank, then what the rank does. Rank 0 prints `ended after <s>: <message>` when its collective fails.
SCRIPT = r"""
import os, signal, socket, sys, time
from widenet_ds.engine.quiet import quiet_third_party
quiet_third_party()  # as the training entry does, before torch
import torch, torch.distributed as dist
from widenet_ds.distributed.collective_timeouts import apply_current_timeout, start_up_timeout, use_training_timeout
from widenet_ds.distributed.every_rank import raise_problems_of_every_rank
from widenet_ds.distributed.lost_peer import lost_peer_message
from widenet_ds.distributed.peer_watch import watch_peers

rank, what = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=start_up_timeout(60, float(os.environ["TRAIN_S"])))
if what == "problems":
    mine = {0: ["shared problem"], 1: ["shared problem", "--data /x does not exist"]}[rank]
    try:
        raise_problems_of_every_rank(mine, "the test settings")
    except Exception as err:
        print(f"rank {rank}: {type(err).__name__} same={getattr(err, 'same_on_every_rank', False)}: {err}", flush=True)
    os._exit(0)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))
watch_peers(None, "test-rank")
group = dist.new_group([0, 1])  # as DeepSpeed's: torch gives it 30 minutes
apply_current_timeout()
dist.barrier(group=group)
use_training_timeout()
print(f"rank {rank} ready", flush=True)
if what == "gone":  # rank 0, which serves the store, ends; rank 1's watch beats on into it
    if rank == 0:
        os._exit(0)
    time.sleep(12)  # several beats into the gone store (a loaded machine reconnects slowly: 7 s missed it once)
    print("rank 1 done", flush=True)
    os._exit(0)
if rank == 1:
    time.sleep(float(os.environ["RANK1_SLEEP"]))  # alive (its watch beats), just late; or stopped meanwhile
    dist.all_reduce(torch.ones(1), group=group)
    time.sleep(2)
    os._exit(0)
start = time.monotonic()
try:
    dist.all_reduce(torch.ones(1), group=group)
    print(f"collective done after {time.monotonic() - start:.1f}; stop={stop}", flush=True)
except RuntimeError as err:
    print(f"ended after {time.monotonic() - start:.1f}: {lost_peer_message(err, rank, None)}", flush=True)
os._exit(0)  # no teardown of a group whose peer is stopped
"""


def start(tmp_path, what: str, **env: str) -> list[subprocess.Popen]:
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    environ = child_env(**{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TRAIN_S": "15", **env})
    return [subprocess.Popen([sys.executable, str(script), str(rank), what], cwd=REPO, env=environ,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]


def wait_ready(proc: subprocess.Popen, rank: int) -> None:
    line = proc.stdout.readline()
    while line and line.strip() != f"rank {rank} ready":
        line = proc.stdout.readline()
    assert line, f"rank {rank} ended before it was ready"


def finish(procs: list[subprocess.Popen], wait: bool = False) -> list[str]:
    """The ranks' output; those still running (a stopped one) killed, unless `wait`."""
    outputs = []
    for proc in procs:
        if proc.poll() is None and not wait:
            proc.kill()
        try:
            outputs.append(proc.communicate(timeout=60)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs.append(proc.communicate()[0])
    return outputs


def test_a_collective_whose_peer_is_stopped_ends_at_the_training_bound_naming_the_silent_rank(tmp_path):
    rank0, rank1 = start(tmp_path, "wait", RANK1_SLEEP="600")  # stopped before it joins the collective
    try:
        wait_ready(rank0, 0)
        wait_ready(rank1, 1)
        os.kill(rank1.pid, signal.SIGSTOP)
        assert rank0.wait(timeout=120) == 0
    finally:
        out0, _ = finish([rank0, rank1])
    ended = next((line for line in out0.splitlines() if line.startswith("ended after ")), out0)
    took = float(ended.split()[2].rstrip(":"))
    # --train-timeout 15 s; torch's default for a new group would be 30 minutes
    assert 14 <= took < 60, ended
    assert (f"waited in a collective for its whole timeout, 15 s (--train-timeout), for rank 1 on "
            f"{socket.gethostname()}, whose heartbeat stood still") in ended
    assert "no checkpoint had been saved yet" in ended


@pytest.mark.slow
def test_sigterm_ends_a_rank_waiting_for_a_stopped_peer_with_one_line(tmp_path):
    rank0, rank1 = start(tmp_path, "wait", TRAIN_S="600", RANK1_SLEEP="600")
    try:
        wait_ready(rank0, 0)
        wait_ready(rank1, 1)
        os.kill(rank1.pid, signal.SIGSTOP)
        time.sleep(1)
        os.kill(rank0.pid, signal.SIGTERM)
        signalled = time.monotonic()
        status = rank0.wait(timeout=120)
        took = time.monotonic() - signalled
    finally:
        out0, _ = finish([rank0, rank1])
    assert status == 1, out0
    # SUSPECT_S + STALE_S + a poll: 26 s after the wait began; 60 s leaves room for a loaded machine
    assert took < 60, out0
    lines = [line for line in out0.splitlines() if "error:" in line]
    assert len(lines) == 1, out0
    assert lines[0].startswith(f"test-rank: error: rank 0 on {socket.gethostname()} got SIGTERM while waiting ")
    assert f"in all_reduce (called from " in lines[0] and f"for rank 1 on {socket.gethostname()}, which has not" in lines[0]


@pytest.mark.slow
def test_sigterm_during_a_wait_for_a_live_but_late_peer_lets_the_collective_finish(tmp_path):
    rank0, rank1 = start(tmp_path, "wait", TRAIN_S="600", RANK1_SLEEP="35")  # longer than SUSPECT_S + STALE_S
    try:
        wait_ready(rank0, 0)
        time.sleep(2)
        os.kill(rank0.pid, signal.SIGTERM)
        assert rank0.wait(timeout=120) == 0
    finally:
        out0, _ = finish([rank0, rank1], wait=True)
    assert "collective done after" in out0 and "stop=['SIGTERM']" in out0, out0


@pytest.mark.slow
def test_a_rank_waiting_for_a_silent_peer_ends_by_itself_after_the_watchs_bound(tmp_path):
    rank0, rank1 = start(tmp_path, "wait", TRAIN_S="600", RANK1_SLEEP="600")
    try:
        wait_ready(rank0, 0)
        wait_ready(rank1, 1)
        os.kill(rank1.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        status = rank0.wait(timeout=LOST_S + 60)
        took = time.monotonic() - stopped
    finally:
        out0, _ = finish([rank0, rank1])
    assert status == 1, out0
    # SUSPECT_S + LOST_S + a poll after the wait began; far below --train-timeout 600
    assert LOST_S < took < LOST_S + 30, out0
    lines = [line for line in out0.splitlines() if "error:" in line]
    assert len(lines) == 1, out0
    assert lines[0].startswith(f"test-rank: error: rank 0 on {socket.gethostname()} waited ") and \
        "in all_reduce (called from " in lines[0] and \
        f"for rank 1 on {socket.gethostname()}, which has not answered for {LOST_S:.0f} s or more" in lines[0], lines


@pytest.mark.parametrize("level, stack", [(None, False), ("WARNING", True)])
def test_a_rank_whose_rank_0_has_gone_prints_no_cpp_stack(tmp_path, level, stack):
    """torch's C++ warning of a store call after its server ended carries a 20-frame stack; a rank's heartbeat
    made it after rank 0 had said what happened (a refusal on 2 ranks: rank 0 prints and exits first). Set
    TORCH_CPP_LOG_LEVEL=WARNING, it is there again: the test sees it when it is printed."""
    extra = {"TORCH_CPP_LOG_LEVEL": level} if level else {}
    outputs = finish(start(tmp_path, "gone", **extra), wait=True)
    assert "rank 1 done" in outputs[1], outputs[1]
    assert ("frame #" in outputs[1]) == stack, outputs[1]


def test_every_ranks_problems_are_one_error_naming_the_ranks_that_have_them(tmp_path):
    outputs = finish(start(tmp_path, "problems"), wait=True)
    host = socket.gethostname()
    for rank, output in enumerate(outputs):
        assert (f"rank {rank}: ConfigError same=True: 2 problems with the test settings:\n  - shared problem\n"
                f"  - rank 1 on {host}: --data /x does not exist") in output, output


def test_ranks_are_named_by_node_in_spans():
    hosts = ["node1"] * 8 + ["node2"] * 8 + ["node3"] * 2
    assert describe_ranks([1], hosts) == "rank 1 on node1"
    assert describe_ranks([*range(8, 16), 16], hosts) == "ranks 8-15 on node2 and rank 16 on node3"
    assert describe_ranks([5, 0, 2, 3], hosts) == "ranks 0, 2-3, 5 on node1"
