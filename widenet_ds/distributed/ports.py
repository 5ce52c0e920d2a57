"""Rendezvous ports: a free one, and who holds a busy one.

Rank 0 serves the rendezvous (torch's TCPStore) on MASTER_PORT. Another program already listening there
makes torch fail with a `DistNetworkError ... EADDRINUSE` traceback -- or worse, the other ranks reach that
program instead. So the port is tried before any rank starts (`widenet-ds launch --master-port`), and rank 0's
failed bind (`deepspeed`, `srun`, `mpiexec` started by hand, or a run that took the port after that check)
becomes one error naming the holder (distributed/groups.py).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether this host can serve `port` now: bound as torch's TCPStore binds it (all interfaces,
    SO_REUSEADDR), so it fails where the store would."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


LISTEN, TIME_WAIT = "0A", "06"  # socket states in /proc/net/tcp


def _sockets(port: int) -> list[tuple[str, str]]:
    """(state, inode) of the local sockets on `port` (Linux /proc/net/tcp, tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl, local "ADDR:PORT" (hex), remote, state, ..., inode (10th)
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.append((fields[3], fields[9]))
    return found


def port_holder(port: int) -> str:
    """Who holds `port`: "PID 123 (`python -m http.server 29500`)", or what can be said without it."""
    sockets = _sockets(port)
    wanted = {f"socket:[{inode}]" for state, inode in sockets if state == LISTEN}
    if wanted:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if any(os.readlink(fd) in wanted for fd in (proc / "fd").iterdir()):
                    command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"PID {proc.name} (`{command[:200]}`)"
            except OSError:  # ended meanwhile, or another user's process
                continue
        return "a program of another user"
    if any(state == TIME_WAIT for state, _ in sockets):
        return "a connection of a program that has ended (TIME_WAIT: the port is free again within a minute)"
    return "another program"
