"""`NodeWatch`: a runner still running after pdsh reported a failed node is stopped, with its stderr passed through
(the real case, a busy rendezvous port on node 1 of the 2-node cluster: tests/integration/test_two_nodes.py)."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time

from widenet_ds.launch.node_failures import NodeWatch, launcher_pattern

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


def test_the_other_nodes_launchers_of_this_run_are_found_by_their_arguments_not_the_shell_that_kills_them():
    """What `NodeWatch` stops the other nodes with: `pkill -f PATTERN` run by a remote shell, whose own command line
    holds PATTERN; another run's launchers on the same nodes (another rendezvous port) are not this run's."""
    pdsh = ["pdsh", "-S", "-f", "1024", "-w", "node1,node2", "export A=1; ", "cd /w;", "/venv/bin/python", "-u", "-m",
            "deepspeed.launcher.launch", "--world_info=eyJub2RlMSI6IFswXX0+/=", "--node_rank=%n",
            "--master_addr=10.77.0.1", "--master_port=29500", "--module", "widenet_ds.train", "pretrain"]
    pattern = launcher_pattern(pdsh)
    launcher = ("/venv/bin/python -u -m deepspeed.launcher.launch --world_info=eyJub2RlMSI6IFswXX0+/= --node_rank=1 "
                "--master_addr=10.77.0.1 --master_port=29500 --module widenet_ds.train pretrain")
    assert re.search(pattern, launcher)
    assert not re.search(pattern, f"bash -c export A=1; cd /w; {launcher}")  # the shell that started it
    assert not re.search(pattern, f"bash -c pkill -f {shlex.quote(pattern)}")
    assert not re.search(pattern, launcher.replace("29500", "29501"))
    assert launcher_pattern(["pdsh", "-w", "node1", "hostname"]) is None
