"""A job's shape: its nodes and the ranks on each, and how the ranks are grouped, as DeepSpeed groups them
(deepspeed/utils/groups.py): expert-parallel groups of `ep_size` ranks that share one copy of the experts, each
rank holding num_experts / ep_size of them; the ranks holding the same experts (an expert-data-parallel group), which
average those experts' gradients; ParaFormer's branch groups of consecutive ranks. Rank r is the r-th slot in node
order, as DeepSpeed's launcher numbers them."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from deepspeed.utils.groups import _get_expert_parallel_ranks

from widenet_ds.distributed.parallel import ParallelPlan


@dataclass(frozen=True)
class JobShape:
    nodes: tuple[tuple[str, int], ...]  # (host, ranks on it), in rank order
    ep_size: int = 1
    branch_parallel: int = 1
    num_experts: int | None = None      # None: a dense model
    data_before_experts: bool = False   # DeepSpeed's use_data_before_expert_parallelism (the JSON's)

    @classmethod
    def even(cls, num_nodes: int, ranks_per_node: int, **layout) -> JobShape:
        """`num_nodes` nodes of `ranks_per_node` ranks each (a Slurm job's --nodes x --gpus-per-node)."""
        names = ["this machine"] if num_nodes == 1 else [f"node {n + 1}" for n in range(num_nodes)]
        return cls(tuple((name, ranks_per_node) for name in names), **layout)

    @property
    def world_size(self) -> int:
        return sum(ranks for _, ranks in self.nodes)

    def node_of(self, rank: int) -> str:
        ends = list(accumulate(ranks for _, ranks in self.nodes))
        return next(host for (host, _), end in zip(self.nodes, ends) if rank < end)

    def ranks_of(self, node: int) -> range:
        """The ranks of the `node`-th node."""
        start = sum(ranks for _, ranks in self.nodes[:node])
        return range(start, start + self.nodes[node][1])

    def parallel_plan(self, rank: int) -> ParallelPlan:
        """The in-rank plan of `rank` (distributed/parallel.py): the layout checked against the world."""
        return ParallelPlan(self.world_size, rank, self.ep_size, self.branch_parallel)

    # -- DeepSpeed's groups --------------------------------------------------------------------------
    def _expert_groups(self) -> tuple[list[list[int]], list[list[int]]]:
        return _get_expert_parallel_ranks(self.world_size, 1, self.ep_size,
                                          use_data_before_expert_parallel_=self.data_before_experts)

    @property
    def expert_parallel_groups(self) -> list[list[int]]:
        """Ranks sharing one copy of the experts (their all-to-all)."""
        return self._expert_groups()[0]

    @property
    def expert_data_parallel_groups(self) -> list[list[int]]:
        """Ranks holding the same experts (their gradients' average; ZeRO partitions them over these ranks)."""
        return self._expert_groups()[1]

    @property
    def branch_groups(self) -> list[range]:
        return [range(first, first + self.branch_parallel) for first in range(0, self.world_size, self.branch_parallel)]

    def experts_of(self, rank: int) -> range:
        """The global indices of the experts `rank` holds (empty for a dense model): rank i of its expert-parallel
        group holds experts [i E / ep, (i + 1) E / ep)."""
        if self.num_experts is None:
            return range(0)
        local = self.num_experts // self.ep_size
        group = next(g for g in self.expert_parallel_groups if rank in g)
        first = group.index(rank) * local
        return range(first, first + local)

    def expert_data_parallel_place(self, rank: int) -> tuple[int, int]:
        """(ranks of `rank`'s expert-data-parallel group, its place in it)."""
        group = next(g for g in self.expert_data_parallel_groups if rank in g)
        return len(group), group.index(rank)
