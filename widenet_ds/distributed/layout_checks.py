"""The checks of a run's parallel layout against its world and its model: expert parallelism (`--ep-size`) against
the ranks and the experts, ParaFormer's branch groups (`--branch-parallel`) against the ranks and the branches.
Imports neither torch nor DeepSpeed: the start-up of every rank (distributed/parallel.py, `ParallelPlan.plan`) and
`widenet-ds launch`, which knows the rank count before it starts anything, make the same checks."""

from __future__ import annotations

from widenet_ds.errors import ConfigError


def check_ep_size(ep_size: int, world_size: int, num_experts: int | None) -> None:
    """The one check of the expert-parallel size, before anything is built: groups of ep_size consecutive
    ranks each hold num_experts / ep_size experts (num_experts None: a dense model, nothing to place)."""
    if isinstance(ep_size, bool) or not isinstance(ep_size, int) or ep_size < 1:
        raise ConfigError(f"--ep-size must be a positive integer, got {ep_size!r}.")
    if ep_size == 1:
        return
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0
                and (num_experts is None or num_experts % d == 0)]
    if num_experts is None:
        raise ConfigError(f"--ep-size {ep_size} places experts, but the model is dense (ffn = 'dense'); drop --ep-size.")
    if world_size % ep_size:
        raise ConfigError(f"--ep-size {ep_size} does not divide the {world_size} rank(s); use one of {divisors} or "
                          f"launch a multiple of {ep_size} ranks.")
    if num_experts % ep_size:
        raise ConfigError(f"--ep-size {ep_size} does not divide the model's {num_experts} experts: each rank of an "
                          f"expert-parallel group must hold the same number of experts; use one of {divisors}.")


def check_layout(world_size: int, ep_size: int, branch_parallel: int, model_config) -> None:
    """The layout checked against the world and the model (its num_experts, num_branches) before anything is
    built: one error naming every problem of the branch groups, after the expert-parallel size's own."""
    check_ep_size(ep_size, world_size, model_config.moe.num_experts if model_config.is_moe else None)
    if branch_parallel == 1:
        return
    problems = []
    if model_config.num_branches == 1:
        problems.append("the model has one branch: use a ParaFormer layout (num_branches > 1, e.g. "
                        "paraformer-tiny-3x4) or drop --branch-parallel")
    elif branch_parallel > model_config.num_branches:
        problems.append(f"the model has {model_config.num_branches} branches, fewer than the {branch_parallel} "
                        f"ranks of a branch group: use at most {model_config.num_branches}")
    if world_size % branch_parallel:
        problems.append(f"it does not divide the {world_size} rank(s): launch a multiple of {branch_parallel} "
                        f"ranks")
    if ep_size != 1:
        problems.append(f"expert parallelism (--ep-size {ep_size}) inside branch groups is not supported: "
                        f"use --ep-size 1")
    if problems:
        raise ConfigError(f"--branch-parallel {branch_parallel}: " + "; ".join(problems) + ".")
