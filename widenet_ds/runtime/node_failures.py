"""A multi-node launch whose node failed stops the other nodes instead of waiting for them forever.

DeepSpeed's pdsh runner waits until every node's ssh session has ended. When one node's ranks end with an error
while the others wait for them in a place no peer error reaches (the rendezvous: rank 0 refused a busy port on
node 1, and rank 1 on node 2 waits for a rendezvous that never answers), the run hangs for the 30-minute
process-group timeout. Seen on the 2-node test cluster (tests/integration/test_two_nodes.py). pdsh names each
node that ended badly (`pdsh@node1: node1: ssh exited with exit code 2`); `NodeWatch` passes the runner's stderr
through, notices that line, and after a grace period (the other ranks usually end by themselves within seconds,
each with its own message) stops the runner, whose SIGTERM handler kills the launchers on every node.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

PROG = "widenet-ds launch"
NODE_EXIT = re.compile(rb"^pdsh@\S+: (?P<node>\S+): ssh exited with exit code (?P<status>\d+)")
GRACE_S = 10.0  # time for the other nodes' ranks to notice by themselves (a lost peer: ~6 s on the test cluster)
SSH_FAILED = 255  # ssh's own exit status (pdsh passes it on): not a rank's, and not a signal's


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


class NodeWatch:
    """Pass `runner`'s stderr through; after a node ended with an error, stop the runner if it is still running
    `grace` seconds later."""

    def __init__(self, runner: subprocess.Popen, grace: float = GRACE_S) -> None:
        self.runner, self.grace = runner, grace
        self.failed: tuple[str, int] | None = None  # the first node that ended with an error, its status
        self.stopped = False  # whether this watch stopped the runner
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
        self.runner.send_signal(signal.SIGTERM)  # deepspeed's runner then kills the launchers on every node

    def close(self) -> None:
        """After the runner ended: the rest of its stderr written out, the timer cancelled."""
        if self._timer is not None:
            self._timer.cancel()
        self._reader.join(timeout=10)
