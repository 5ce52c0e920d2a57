"""`NodeWatch`: a runner still running after pdsh reported a failed node is stopped, with its stderr passed through
(the real case, a busy rendezvous port on node 1 of the 2-node cluster: tests/integration/test_two_nodes.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from widenet_ds.runtime.node_failures import NodeWatch

# A stand-in for deepspeed's runner that prints what pdsh prints, then waits as pdsh does for the other node.
RUNNER = """
import sys, time
print("node2: waiting for the rendezvous", file=sys.stderr, flush=True)
print("pdsh@node1: node1: ssh exited with exit code {status}", file=sys.stderr, flush=True)
time.sleep(60)
"""


def start(status: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUNNER.format(status=status)], stderr=subprocess.PIPE)


def test_a_failed_node_stops_the_runner_after_the_grace_period(capfd):
    runner = start(2)
    watch = NodeWatch(runner, grace=0.5)
    assert runner.wait(timeout=30) == -signal.SIGTERM
    watch.close()
    assert watch.failed == ("node1", 2) and watch.stopped
    err = capfd.readouterr().err
    assert "node2: waiting for the rendezvous" in err  # passed through
    assert "widenet-ds launch: node node1 ended with exit status 2 and the other nodes still run" in err


def test_a_node_that_ended_well_stops_nothing():
    runner = start(0)
    watch = NodeWatch(runner, grace=0.2)
    time.sleep(1.5)  # well past the grace period
    assert runner.poll() is None and watch.failed is None and not watch.stopped
    runner.kill()
    runner.wait()
    watch.close()
