"""A rank whose peer died or stopped answering: one line saying so instead of a collective's traceback.

When another rank's process ends mid-run (killed, out of memory, its node gone), the next collective of every
other rank fails with the transport's error: gloo's `Read error [10.77.0.2]:4312: Connection reset by peer`
under 40 lines of traceback through the model, which reads like a bug of the model. Seen on the 2-node test
cluster (tests/integration/test_two_nodes.py): node 1's rank ended within seconds, but with that traceback.
When the peer's node vanished instead (powered off, its link cut), no reset ever arrives: the collective runs
out of its time (distributed/collective_timeouts.py) with gloo's `Timed out waiting 300000ms for recv operation`,
which names nobody; the rank's watch (distributed/peer_watch.py) knows whose heartbeat stood still.
`lost_peer_message` recognises these errors and says what happened, which rank and node where it can be known,
where that rank's own messages are, and how to continue.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

from widenet_ds.distributed.collective_timeouts import current_bound
from widenet_ds.errors import WideNetError

# gloo's (tcp transport) and NCCL's words for a peer that is gone
LOST_PEER = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|remote process exited|"
                       r"NCCL communicator was aborted")
# ... and for a collective that ran out of time (gloo; NCCL's watchdog; a store wait of the rendezvous)
TIMED_OUT = re.compile(r"Timed out waiting|timed out|Watchdog caught collective operation timeout")
# The peer's address where gloo names it, before or after those words: `[10.77.0.2]:5826` (not the
# `[/path/pair.cc:553]` of its source line).
PEER = re.compile(r"\[(?P<address>[^\]\s/]+)\]:\d+")
# What names the rank a timed-out collective waited for: the rank's watch registers itself (distributed/peer_watch.py)
_NAMER: list[Callable[[], str | None]] = []


def name_silent_peers_with(namer: Callable[[], str | None]) -> None:
    """`namer()`: `rank 1 on node2` when a peer's heartbeat stood still in the wait that just failed, else None."""
    _NAMER[:] = [namer]


def resume_advice(checkpoints: Path | None) -> str:
    """What to do next: the last complete checkpoint to continue from with --resume, or start again."""
    latest = checkpoints / "latest" if checkpoints is not None else None
    if latest is not None and latest.is_file():
        return (f"the last complete checkpoint, {checkpoints / latest.read_text().strip()}, is kept: run the same "
                f"command with --resume to continue from it")
    return "no checkpoint had been saved yet: start the run again"


def lost_peer_message(err: BaseException, rank: int, checkpoints: Path | None) -> str | None:
    """The line for `err` when it is a lost peer or a collective that timed out, else None. `checkpoints`: the
    run's checkpoint folder."""
    if isinstance(err, WideNetError):  # a user error (LaunchError is a RuntimeError too): it says what to fix itself
        return None
    text = str(err)
    first = text.splitlines()[0][:200] if text else ""
    if LOST_PEER.search(text) is not None:
        address = PEER.search(text)
        peer = f" at {address.group('address')}" if address else ""
        return (f"rank {rank} on {socket.gethostname()} lost its connection to another rank{peer} in the middle of a "
                f"collective: that rank's process or node ended (its own messages, above, say why). The run stopped; "
                f"{resume_advice(checkpoints)}. ({type(err).__name__}: {first})")
    if TIMED_OUT.search(text) is not None:
        silent = _NAMER[0]() if _NAMER else None
        who = (f"{silent}, whose heartbeat stood still: its process or node has ended, is stopped or is cut off"
               if silent else "another rank: its process or node has ended, hangs or is cut off")
        return (f"rank {rank} on {socket.gethostname()} waited in a collective for its whole timeout, {current_bound()}, "
                f"for {who} (its own messages, if any, are above). The run stopped; {resume_advice(checkpoints)}. "
                f"({type(err).__name__}: {first})")
    return None
