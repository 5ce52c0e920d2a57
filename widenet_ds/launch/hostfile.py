"""DeepSpeed's hostfile, checked before `widenet-ds launch` starts anything: every host resolves and the requested
ranks fit its slots. `python -m widenet_ds.launch.hostfile check-hostfile --hostfile H [--num-ranks N]` is the same
check on its own (a Slurm or MPI job script runs it before its launcher)."""

from __future__ import annotations

import argparse
import re
import socket
import sys
from pathlib import Path

from widenet_ds.errors import LaunchError

HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")


def read_hostfile(path: str | Path) -> dict[str, int]:
    """DeepSpeed's hostfile: `host slots=N` per line, `#` comments. Host -> slots, in file order."""
    path = Path(path)
    if not path.is_file():
        raise LaunchError(f"hostfile {path} does not exist; write one line `<host> slots=<GPUs>` per node "
                          f"or leave out --hostfile to run on this machine only")
    slots: dict[str, int] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = HOSTFILE_LINE.match(line)
        if match is None:
            raise LaunchError(f"{path}:{number}: {raw.strip()!r} is not `<host> slots=<N>`; fix the line")
        host, count = match.group(1), int(match.group(2))
        if host in slots:
            raise LaunchError(f"{path}:{number}: host {host!r} listed twice; keep one line per host")
        if count < 1:
            raise LaunchError(f"{path}:{number}: host {host!r} has slots={count}; give it at least 1 or "
                              f"remove the line")
        slots[host] = count
    if not slots:
        raise LaunchError(f"hostfile {path} lists no hosts; add `<host> slots=<GPUs>` lines")
    return slots


def check_hostfile(path: str | Path, requested_ranks: int | None = None, *, num_nodes: int | None = None,
                   ranks_per_node: int | None = None, resolve: bool = True) -> dict[str, int]:
    """Read a hostfile and check it can hold the launch, before anything starts.

    Every host must resolve (`resolve` False: a dry run on a machine outside the cluster). `num_nodes`/
    `ranks_per_node` are the `deepspeed` launcher's --num_nodes/--num_gpus: it takes the first `num_nodes` hosts
    and starts `ranks_per_node` ranks on each whatever its slots say, so each chosen host needs that many slots.
    `requested_ranks` is a total to fit into the slots of the chosen hosts. Returns host -> slots of the chosen hosts.
    """
    slots = read_hostfile(path)
    for host in slots if resolve else ():
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror as err:
            raise LaunchError(f"host {host!r} in hostfile {path} does not resolve ({err.strerror}); fix "
                              f"the name, add it to /etc/hosts or DNS, or remove its line") from None
    if num_nodes is not None:
        if num_nodes > len(slots):
            raise LaunchError(f"{num_nodes} nodes requested but hostfile {path} lists {len(slots)} hosts; "
                              f"request at most {len(slots)} nodes or add hosts to the hostfile")
        slots = dict(list(slots.items())[:num_nodes])
    if ranks_per_node is not None:
        short = {host: count for host, count in slots.items() if count < ranks_per_node}
        if short:
            listing = ", ".join(f"{host}: {count}" for host, count in short.items())
            raise LaunchError(f"{ranks_per_node} ranks per node requested but hostfile {path} gives fewer "
                              f"slots to {listing}; request at most {min(short.values())} GPUs per node or "
                              f"raise the slots of those hosts")
        requested_ranks = max(requested_ranks or 0, ranks_per_node * len(slots))
    total = sum(slots.values())
    if requested_ranks is not None and requested_ranks > total:
        listing = ", ".join(f"{host}: {count}" for host, count in slots.items())
        raise LaunchError(f"{requested_ranks} ranks requested but hostfile {path} offers {total} slots "
                          f"({listing}); request at most {total} ranks or add hosts/slots to the hostfile")
    return slots


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m widenet_ds.launch.hostfile",
                                     description="Checks run before a multi-node launch.")
    commands = parser.add_subparsers(dest="command", required=True)
    hostfile = commands.add_parser("check-hostfile", help="hosts resolve and the requested ranks fit")
    hostfile.add_argument("--hostfile", required=True)
    hostfile.add_argument("--num-ranks", type=int, default=None, help="ranks the launch will start in all")
    hostfile.add_argument("--num-nodes", type=int, default=None, help="the launcher's --num_nodes")
    hostfile.add_argument("--num-gpus", type=int, default=None, help="the launcher's --num_gpus (ranks per node)")
    args = parser.parse_args(argv)
    try:
        slots = check_hostfile(args.hostfile, args.num_ranks, num_nodes=args.num_nodes,
                               ranks_per_node=args.num_gpus)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(" ".join(f"{host}:{count}" for host, count in slots.items()))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
