"""A multi-node launch whose node failed stops the other nodes instead of waiting for them forever.

DeepSpeed's pdsh runner waits until every node's ssh session has ended. When one node's ranks end with an error
while the others wait for them in a place no peer error reaches (the rendezvous: rank 0 refused a busy port on
node 1, and rank 1 on node 2 waits for a rendezvous that never answers), the run hangs for the 30-minute
process-group timeout. Seen on the 2-node test cluster (tests/integration/test_two_nodes.py). pdsh names each
node that ended badly (`pdsh@node1: node1: ssh exited with exit code 2`); `NodeWatch` passes the runner's stderr
through, notices that line, and after a grace period (the other ranks usually end by themselves within seconds,
each with its own message) stops the other nodes' DeepSpeed launchers of this run, through a pdsh of its own
(`pkill` of their command line: each TERMs its ranks, which save or, stuck in a collective for a silent peer, end
with one line: distributed/peer_watch.py). Stopping the runner instead (its SIGTERM handler kills pdsh, then the
launchers on every node) closed the ssh sessions that carry the ranks' output first: node 1's line about a vanished
node 2 was lost, seen on the 2-node cluster. The runner is stopped that way only when the launchers do not end.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import BinaryIO

import psutil

PROG = "widenet-ds launch"
NODE_EXIT = re.compile(rb"^pdsh@\S+: (?P<node>\S+): ssh exited with exit code (?P<status>\d+)")
GRACE_S = 10.0  # time for the other nodes' ranks to notice by themselves (a lost peer: ~6 s on the test cluster)
SSH_FAILED = 255  # ssh's own exit status (pdsh passes it on): not a rank's, and not a signal's
LAUNCHERS_END_S = 45.0  # DeepSpeed's launch.py gives its ranks 30 s after its TERM, then kills them
# The arguments of DeepSpeed's launch.py that tell this run's launchers from another run's on the same nodes
LAUNCH_ARGS = ("--world_info=", "--master_addr=", "--master_port=")


def failure(status: int) -> str:
    """What an exit status of the runner (or of a node's ssh, as pdsh reports it) says. deepspeed's launch.py exits
    with a killed rank's negative return code, which the shell reads as 256 - N for signal N; a killed runner reads
    128 + N; 255 is ssh's own failure (a node down, unreachable, refusing the login, or lost mid-run: pdsh's line
    above names it)."""
    if status == SSH_FAILED:
        return ("ssh's own failure: a node was down, unreachable or refused the login, or its connection was lost "
                "mid-run; pdsh's line above names the node")
    for signum, what in ((256 - status, "a rank was killed by"), (status - 128, "the deepspeed runner was killed by")):
        if 0 < signum < 32 and signum in signal.valid_signals():
            return f"{what} {signal.Signals(signum).name}"
    return "a rank failed; its messages are above"


def launcher_pattern(pdsh_argv: Sequence[str]) -> str | None:
    """A `pkill -f` pattern matching this run's DeepSpeed launch.py (from the command line of the runner's pdsh), from
    the start of its command line: not the remote shell that started it (`bash -c "export ...; python -u -m
    deepspeed.launcher.launch ..."`, whose end would close the node's ssh session, and its ranks' output with it),
    nor the one that runs the pkill (each literal character in brackets); None when it is not there."""
    if "deepspeed.launcher.launch" not in pdsh_argv:
        return None
    at = list(pdsh_argv).index("deepspeed.launcher.launch")
    found = [arg for arg in pdsh_argv[at + 1:at + 5] if arg.startswith(LAUNCH_ARGS)]
    if at < 3 or list(pdsh_argv[at - 2:at]) != ["-u", "-m"] or len(found) != len(LAUNCH_ARGS):
        return None
    literal = lambda text: "".join(c if c.isalnum() else f"[{c}]" for c in text)  # noqa: E731
    python, (world, address, port) = pdsh_argv[at - 3], found
    return (f"^{literal(python)} -u -m {literal('deepspeed.launcher.launch')} {literal(world)} --node_rank=[0-9]+ "
            f"{literal(address)} {literal(port)}")


def stop_launchers(runner_pid: int, nodes: Sequence[str], env: Mapping[str, str]) -> bool:
    """`pdsh -w NODES pkill -f <this run's launch.py>`: each TERMs its ranks. False when the runner's pdsh is not
    found (nothing was done)."""
    try:  # Debian's pdsh is a script that execs pdsh.bin: found by its arguments, not its name
        pattern = next(filter(None, (launcher_pattern(p.cmdline()) for p in psutil.Process(runner_pid).children())),
                       None)
    except psutil.Error:
        return False
    if pattern is None:
        return False
    command = ["pdsh", "-S", "-w", ",".join(nodes), "pkill", "-f", shlex.quote(pattern)]
    try:
        subprocess.run(command, env={**env, "PDSH_RCMD_TYPE": "ssh"}, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


class NodeWatch:
    """Pass `runner`'s stderr through; after a node ended with an error, stop the other `nodes`' launchers (or, that
    failing, the runner) if the runner is still running `grace` seconds later. `env`: the runner's environment."""

    def __init__(self, runner: subprocess.Popen, grace: float = GRACE_S, nodes: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> None:
        self.runner, self.grace, self.nodes, self.env = runner, grace, tuple(nodes), dict(env or {})
        self.failed: tuple[str, int] | None = None  # the first node that ended with an error, its status
        self.stopped = False  # whether this watch stopped the run
        self._timer: threading.Timer | None = None
        self._reader = threading.Thread(target=self._pass_through, args=(runner.stderr,), daemon=True)
        self._reader.start()

    def _pass_through(self, stream: BinaryIO) -> None:
        for line in iter(stream.readline, b""):
            try:
                sys.stderr.buffer.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):  # the terminal has gone (HUP): keep draining, or the runner would block
                pass
            match = NODE_EXIT.match(line)
            if match and int(match["status"]) != 0 and self.failed is None:
                self.failed = (match["node"].decode(), int(match["status"]))
                self._timer = threading.Timer(self.grace, self._stop)
                self._timer.daemon = True
                self._timer.start()

    def _stop(self) -> None:
        if self.runner.poll() is not None:
            return
        node, status = self.failed
        why = (f"ssh lost {node}: it is down, unreachable or cut off" if status == SSH_FAILED
               else "its messages above say why")
        print(f"{PROG}: node {node} ended with exit status {status} and the other nodes still run "
              f"{self.grace:.0f} s later: stopping them ({why})", file=sys.stderr, flush=True)
        self.stopped = True
        others = [name for name in self.nodes if name != node]
        if others and stop_launchers(self.runner.pid, others, self.env):
            deadline = time.monotonic() + LAUNCHERS_END_S
            while self.runner.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        if self.runner.poll() is None:
            self.runner.send_signal(signal.SIGTERM)  # deepspeed's runner then kills the launchers on every node

    def close(self) -> None:
        """After the runner ended: the rest of its stderr written out, the timer cancelled."""
        if self._timer is not None:
            self._timer.cancel()
        self._reader.join(timeout=10)
