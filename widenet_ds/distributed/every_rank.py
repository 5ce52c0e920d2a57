"""What each rank finds on its own node, said once for all of them, naming the ranks and nodes.

On a cluster whose nodes have their own disks, a path can exist on one node and not on another (`--data` copied
to node 1 only, an `--output-dir` mounted read-only on node 2). Checked on rank 0 alone, such a problem was never
printed: node 2's rank exited 2 without a line (only rank 0 prints an error every rank shares) while rank 0 waited
for it in its next collective, for ever under srun or mpiexec. Seen on the 2-node test cluster
(tests/integration/test_two_nodes.py). `raise_problems_of_every_rank` gathers every rank's list after the
rendezvous, before any rank goes on, and raises on every rank the one error rank 0 prints: each distinct problem
once, prefixed with the ranks and nodes that have it unless every rank has it.
"""

from __future__ import annotations

import socket

import torch.distributed as torch_dist

from widenet_ds.errors import ConfigError, mark_same_on_every_rank, problems_text


def describe_ranks(ranks: list[int], hosts: list[str]) -> str:
    """`rank 1 on node2`; `ranks 8-15 on node2 and rank 16 on node3` (`hosts[rank]`: each rank's node)."""
    by_host: dict[str, list[int]] = {}
    for rank in sorted(set(ranks)):
        by_host.setdefault(hosts[rank] if rank < len(hosts) else "an unknown node", []).append(rank)
    parts = []
    for host, group in by_host.items():
        spans: list[list[int]] = []
        for rank in group:
            if spans and rank == spans[-1][1] + 1:
                spans[-1][1] = rank
            else:
                spans.append([rank, rank])
        listed = ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)
        parts.append(f"rank{'s' if len(group) > 1 else ''} {listed} on {host}")
    return " and ".join(parts)


def rank_hosts() -> list[str]:
    """Collective: every rank's host name, in rank order."""
    if not torch_dist.is_initialized() or torch_dist.get_world_size() == 1:
        return [socket.gethostname()]
    hosts: list[str | None] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(hosts, socket.gethostname())
    return [str(host) for host in hosts]


def raise_problems_of_every_rank(problems: list[str], what: str) -> None:
    """Collective: one ConfigError on every rank naming every rank's `problems` (see the module docstring);
    nothing when no rank has any. `what`: the settings they are problems of, for a list's heading."""
    world = torch_dist.get_world_size() if torch_dist.is_initialized() else 1
    if world == 1:
        found = [(socket.gethostname(), problems)]
    else:
        found = [None] * world
        torch_dist.all_gather_object(found, (socket.gethostname(), list(problems)))
    hosts = [host for host, _ in found]
    where: dict[str, list[int]] = {}
    for rank, (_, listed) in enumerate(found):
        for problem in listed:
            where.setdefault(problem, []).append(rank)
    lines = [problem if len(ranks) == world else f"{describe_ranks(ranks, hosts)}: {problem}"
             for problem, ranks in where.items()]
    if lines:
        raise mark_same_on_every_rank(ConfigError(problems_text(lines, what)))
