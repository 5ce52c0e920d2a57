"""A rank whose peer died: one line saying so instead of a collective's traceback.

When another rank's process ends mid-run (killed, out of memory, its node gone), the next collective of every
other rank fails with the transport's error: gloo's `Read error [10.77.0.2]:4312: Connection reset by peer`
under 40 lines of traceback through the model, which reads like a bug of the model. Seen on the 2-node test
cluster (tests/integration/test_two_nodes.py): node 1's rank ended within seconds, but with that traceback.
`lost_peer_message` recognises these errors and says what happened, where the other rank's own messages are,
and how to continue.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

# gloo's (tcp transport) and NCCL's words for a peer that is gone
LOST_PEER = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|remote process exited|"
                       r"NCCL communicator was aborted")
# The peer's address where gloo names it, before or after those words: `[10.77.0.2]:5826` (not the
# `[/path/pair.cc:553]` of its source line).
PEER = re.compile(r"\[(?P<address>[^\]\s/]+)\]:\d+")


def lost_peer_message(err: BaseException, rank: int, checkpoints: Path | None) -> str | None:
    """The line for `err` when it is a lost peer, else None. `checkpoints`: the run's checkpoint folder."""
    if LOST_PEER.search(str(err)) is None:
        return None
    address = PEER.search(str(err))
    peer = f" at {address.group('address')}" if address else ""
    latest = checkpoints / "latest" if checkpoints is not None else None
    if latest is not None and latest.is_file():
        kept = (f"the last complete checkpoint, {checkpoints / latest.read_text().strip()}, is kept: run the same "
                f"command with --resume to continue from it")
    else:
        kept = "no checkpoint had been saved yet: start the run again"
    return (f"rank {rank} on {socket.gethostname()} lost its connection to another rank{peer} in the middle of a "
            f"collective: that rank's process or node ended (its own messages, above, say why). The run stopped; "
            f"{kept}. ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
