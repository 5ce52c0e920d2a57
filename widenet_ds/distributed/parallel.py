"""The run's parallel layout, planned and checked once before anything is built: expert parallelism
(`--ep-size`: which ranks share one copy of the experts) and ParaFormer's branch parallelism
(`--branch-parallel N`: groups of N consecutive ranks each run one copy of the batch, every rank its share
of the branches), data parallelism over what is left.

The model is written for one device. DeepSpeed's MoE sizes its local experts when it is built, so the
expert-parallel size reaches the model's constructor; branch parallelism is applied to the built model
from outside (`apply`).

Branch parallelism under DeepSpeed's data-parallel gradient average: every rank of a branch group holds the
same batch. The head, the final LayerNorm and the embeddings see the same gradient on each of them (the
encoder input's backward sums the branches' contributions over the group), so the average over ranks is
their gradient. A branch's own parameters have a gradient on one rank of the group only, and the modules
every branch shares (WideNet's attention and MoE) a part on each: their sum over the group is the gradient,
so `apply` scales them by N before DeepSpeed averages over the N ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as torch_dist
from torch import nn

from widenet_ds.distributed.layout_checks import check_layout
from widenet_ds.engine.ds_config import DeepSpeedSettings
from widenet_ds.errors import ConfigError
from widenet_ds.model.branches import BranchParallel


@dataclass(frozen=True)
class ParallelPlan:
    world_size: int
    rank: int
    ep_size: int = 1
    branch_parallel: int = 1  # ranks sharing one copy of the batch, each running its branches (1: off)

    @classmethod
    def plan(cls, world_size: int, rank: int, ep_size: int, branch_parallel: int, model_config) -> ParallelPlan:
        """Checked against the world and the model (distributed/layout_checks.py) before anything is built."""
        check_layout(world_size, ep_size, branch_parallel, model_config)
        return cls(world_size, rank, ep_size, branch_parallel)

    # -- the layout ----------------------------------------------------------------------------------
    @property
    def data_parallel_size(self) -> int:
        """Copies of the batch: what the DeepSpeed JSON's train_batch_size is divided by."""
        return self.world_size // self.branch_parallel

    @property
    def data_parallel_rank(self) -> int:
        """Which copy of the data this rank reads (the ranks of a branch group read the same)."""
        return self.rank // self.branch_parallel

    def check_deepspeed(self, ds: DeepSpeedSettings) -> None:
        """Branch groups rely on DeepSpeed reducing every parameter's gradient as one tensor (a rank holds none
        for the other ranks' branches, which stage 0 fills with zeros); ZeRO's buckets and the fp16/bf16
        optimizers' flat buffers do not."""
        if self.branch_parallel == 1:
            return
        problems = ds.per_tensor_update_problems()
        if problems:
            raise ConfigError(f"--branch-parallel {self.branch_parallel} runs with fp32 ZeRO stage 0 only ("
                              + "; ".join(problems) + "), or drop --branch-parallel.")

    def deepspeed_config(self, config: dict) -> dict:
        """The JSON DeepSpeed is given: its batch check counts every rank as a data-parallel one."""
        if self.branch_parallel == 1 or "train_batch_size" not in config:
            return config
        return {**config, "train_batch_size": config["train_batch_size"] * self.branch_parallel}

    # -- applying it ---------------------------------------------------------------------------------
    def apply(self, model: nn.Module) -> None:
        """Branch parallelism on the built model (before DeepSpeed wraps it). Collective: every rank creates
        every branch group."""
        if self.branch_parallel == 1:
            return
        size = self.branch_parallel
        groups = [torch_dist.new_group(list(range(first, first + size))) for first in range(0, self.world_size, size)]
        encoder = model.encoder
        encoder.branch_parallel = BranchParallel.contiguous(encoder.cfg.num_branches, self.rank % size, size,
                                                            groups[self.rank // size])
        shared_by_branches = [p for modules in (encoder.attention, encoder.ffn, encoder.attention_norm,
                                                encoder.ffn_norm) for p in modules.parameters()]
        for param in shared_by_branches:
            param.register_hook(lambda grad: grad * size)
