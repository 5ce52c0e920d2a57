"""The preflight's collectives, on the job's own groups created as DeepSpeed creates them for its MoE layers
(deepspeed/utils/groups.py: the data-parallel group, and the expert-parallel groups of `--ep-size` ranks): an
all-reduce over the data-parallel group and an all-to-all in every expert-parallel group at once, as a step runs
them, each with its bus bandwidth (nccl-tests' definition) and a check of every value received.

The all-to-all's payload says who sent it to whom: element k of the chunk rank s sends to rank d holds
(s * world + d) * chunk + k. So a receiver knows which peer's data it holds and for whom it was meant, and a peer
that sends one rank's chunk to another (DeepSpeed#6589's symptom: ranks computing with the wrong experts' tokens)
is named by rank and node.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from deepspeed import comm as ds_comm
from deepspeed.utils import groups

from widenet_ds.distributed.collective_timeouts import apply_current_timeout
from widenet_ds.distributed.every_rank import describe_ranks
from widenet_ds.launch.job_shape import JobShape
from widenet_ds.launch.preflight_table import Row, failed, passed

PAYLOAD_BYTES = {"cuda": 64 << 20, "cpu": 4 << 20}  # per rank and collective
REPEATS = 5  # timed calls after one warm-up; the median counts
NETWORK_FIX = {"nccl": "run the same NCCL (torch's) on every node and look for the link between those ranks: rerun "
                       "with NCCL_DEBUG=INFO, try NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1 to rule one path out "
                       "(docs/gpu.md, \"NCCL settings\")",
               "gloo": "run the same torch (its gloo) on every node and check the network between those nodes: each "
                       "node's host name must resolve, on every node, to the address the others reach it by "
                       "(docs/cluster.md)"}


@dataclass(frozen=True)
class Timed:
    """One rank's share of a collective: its median time and what it received wrong."""

    seconds: float
    bus_bytes: float  # what nccl-tests counts as moved per rank for the bus bandwidth
    wrong: tuple[str, ...] = ()


def job_groups(ep_size: int, data_before_experts: bool) -> str:
    """DeepSpeed's expert and data-parallel groups for `ep_size`, created as its MoE layer creates them (the engines
    built later find them); their name. Collective."""
    name = f"ep_size_{ep_size}"
    if name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep_size, use_data_before_expert_parallel_=data_before_experts)
    groups._get_data_parallel_group()
    apply_current_timeout()  # the new groups get the run's bound, not torch's 30 minutes
    return name


def rank_device() -> torch.device:
    """This rank's device: its GPU by its local rank, as DeepSpeed's engine takes it (the collectives run before any
    engine has set a current device)."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _timed(call, repeats: int = REPEATS) -> float:
    times = []
    for index in range(repeats + 1):
        if torch.cuda.is_available():
            torch.cuda.synchronize(rank_device())
        start = time.perf_counter()
        call()
        if torch.cuda.is_available():
            torch.cuda.synchronize(rank_device())
        if index:  # the first is the warm-up (connections, buffers)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def all_reduce(group) -> Timed:
    """A sum over `group` of int64 values every rank knows the total of: rank r adds (r + 1) * (k % 7 + 1)."""
    size = torch_dist.get_world_size(group)
    count = PAYLOAD_BYTES[rank_device().type] // 8
    pattern = torch.arange(count, device=rank_device()) % 7 + 1
    ranks = groups._get_data_parallel_group_ranks()
    mine = (torch_dist.get_rank() + 1) * pattern
    work = mine.clone()

    def call() -> None:
        work.copy_(mine)
        ds_comm.all_reduce(work, group=group)

    seconds = _timed(call)
    expected = sum(r + 1 for r in ranks) * pattern
    wrong = () if torch.equal(work, expected) else (f"rank {torch_dist.get_rank()} got a wrong sum",)
    return Timed(seconds, count * 8 * 2 * (size - 1) / size, wrong)


def sent_chunk(src: int, dst: int, world: int, chunk: int, device) -> torch.Tensor:
    return (src * world + dst) * chunk + torch.arange(chunk, device=device)


def received_problems(received: torch.Tensor, peers: list[int], me: int, world: int, chunk: int) -> list[str]:
    """What of `received` (one chunk from each of `peers`, in group order) is not what each peer sent `me`."""
    problems = []
    for position, peer in enumerate(peers):
        got = received[position * chunk:(position + 1) * chunk]
        if torch.equal(got, sent_chunk(peer, me, world, chunk, got.device)):
            continue
        code = int(got[0].item()) // chunk
        src, dst = divmod(code, world)
        if 0 <= src < world and torch.equal(got, sent_chunk(src, dst, world, chunk, got.device)):
            meant = f"the data meant for rank {dst}" + (" (itself)" if dst == src else "")
            problems.append(f"rank {peer} sent rank {me} {meant}" if src == peer else
                            f"rank {me} got from rank {peer} what rank {src} sent rank {dst}")
        else:
            problems.append(f"rank {me} got other values than rank {peer} sent it")
    return problems


def all_to_all(group, ranks: list[int]) -> Timed:
    """An all-to-all in this rank's expert-parallel group (`ranks`, in group order), its data value-checked."""
    world, me = torch_dist.get_world_size(), torch_dist.get_rank()
    chunk = PAYLOAD_BYTES[rank_device().type] // 8 // len(ranks)
    send = torch.cat([sent_chunk(me, peer, world, chunk, rank_device()) for peer in ranks])
    received = torch.empty_like(send)
    seconds = _timed(lambda: ds_comm.all_to_all_single(received, send, group=group))
    return Timed(seconds, chunk * 8 * (len(ranks) - 1), tuple(received_problems(received, ranks, me, world, chunk)))


def gbps(timed: list[Timed]) -> float:
    """A group's bus bandwidth: what each rank moves over the slowest rank's time."""
    return timed[0].bus_bytes / max(t.seconds for t in timed) / 1e9


def culprits(problems: list[str], hosts: list[str]) -> list[str]:
    """The nodes of the ranks a value check blames: the sender of data it sent wrong, else the receiver."""
    blamed = []
    for problem in problems:  # "rank S sent rank R ...", "rank R got ..."
        host = hosts[int(problem.split()[1])]
        if host not in blamed:
            blamed.append(host)
    return blamed


def collective_rows(shape: JobShape, hosts: list[str], group_name: str) -> list[Row]:
    """Collective: both collectives on every rank; the rows (every rank gets them, rank 0 prints them)."""
    world = torch_dist.get_world_size()
    reduced = all_reduce(groups._get_data_parallel_group())
    ep_ranks = list(groups._get_expert_parallel_group_ranks(group_name))
    exchanged = all_to_all(groups._get_expert_parallel_group(group_name), ep_ranks)
    everyone: list = [None] * world
    torch_dist.all_gather_object(everyone, (reduced, exchanged, ep_ranks))

    span = describe_ranks(list(range(world)), hosts)
    fix = NETWORK_FIX.get(torch_dist.get_backend(), NETWORK_FIX["nccl"])
    reduce_wrong = [w for r, _, _ in everyone for w in r.wrong]
    if reduce_wrong:
        bad = sorted({hosts[int(w.split()[1])] for w in reduce_wrong}, key=hosts.index)
        rows = [failed("all-reduce", f"data-parallel {span}: {'; '.join(reduce_wrong)}", fix, bad)]
    else:
        rows = [passed("all-reduce", f"data-parallel {span}: every sum right, {gbps([r for r, _, _ in everyone]):.2f} "
                                     f"GB/s bus bandwidth")]
    by_group: dict[tuple[int, ...], list[Timed]] = {}
    for _, timed, ranks in everyone:
        by_group.setdefault(tuple(ranks), []).append(timed)
    wrong = [w for timed in by_group.values() for t in timed for w in t.wrong]
    speeds = {ranks: gbps(timed) for ranks, timed in by_group.items()}
    slowest = min(speeds, key=speeds.get)
    named = {ranks: describe_ranks(list(ranks), hosts) for ranks in speeds}
    listed = ", ".join(f"{named[ranks]} {speed:.2f}" for ranks, speed in speeds.items())
    planned = sorted(tuple(g) for g in shape.expert_parallel_groups)
    if sorted(by_group) != planned:
        rows.append(failed("all-to-all", f"DeepSpeed formed the expert-parallel groups {sorted(by_group)}, the job's "
                                         f"plan (--dry-run) {planned}", "report this with both lists: DeepSpeed's "
                                         "grouping of ranks changed"))
    elif shape.ep_size == 1:
        rows.append(passed("all-to-all", "--ep-size 1: no expert-parallel all-to-all between ranks"))
    elif wrong:
        rows.append(failed("all-to-all", f"expert-parallel groups: {'; '.join(wrong)}", fix, culprits(wrong, hosts)))
    else:
        rows.append(passed("all-to-all", f"{len(speeds)} expert-parallel group{'s' * (len(speeds) > 1)} of "
                                         f"{shape.ep_size}: every value right; GB/s bus bandwidth {listed}"
                                         + (f"; the slowest: {named[slowest]}" if len(speeds) > 1 else "")))
    return rows
