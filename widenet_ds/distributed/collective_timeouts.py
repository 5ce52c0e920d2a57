"""How long any collective may wait: one bound for start-up and a shorter one once training runs.

torch's default is 30 minutes for every gloo group (10 for NCCL), and the groups DeepSpeed creates (`new_group`
without a timeout) get that default whatever `init_process_group` was given. A rank whose peer vanished (its node
powered off, its link cut: no connection reset ever arrives) would wait that long in its next collective. As
torchtitan does (`comm.init_timeout_seconds` 300, `comm.train_timeout_seconds` 100), the wait is bounded in two
phases, set from the command line (`--init-timeout`, default 900 s; `--train-timeout`, default 300 s):

  - start-up (`init_distributed`): the rendezvous, the checks, building the model and the engine, loading a
    checkpoint, and the first step (a compile, the first all-to-all): everything where one rank may legitimately
    wait for a slower one;
  - training (`use_training_timeout`, after each step: cheap once set): every later step, evaluation and checkpoint
    save, where the ranks move in lockstep and the longest healthy wait is the time rank 0 spends alone
    completing a checkpoint (hashing its files) or a slower rank's evaluation.

Each applies to every group this process holds (`torch.distributed`'s own table of them), DeepSpeed's expert and
data-parallel groups included. A collective that runs out of time raises gloo's `Timed out waiting ...`, which
distributed/lost_peer.py turns into one line naming the peer. The defaults and their margins over the
longest healthy waits measured: docs/cluster.md, "Faults: bounded waits".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as torch_dist
from torch.distributed import distributed_c10d

# The longest healthy waits measured (bench/bench_collective_waits.py, 2 CPU ranks on a loaded 2-core machine):
# 6.0 s at start-up and 6.6 s in training (widenet-base-e8, 643 MB checkpoints), and 362 s for the first JIT build
# of DeepSpeed's CPU op, which ranks of a node that builds it later wait for in the rendezvous.
INIT_TIMEOUT_S = 900.0
TRAIN_TIMEOUT_S = 300.0
MIN_TIMEOUT_S = 10.0  # a bound below the longest healthy wait would end healthy runs (and the store's own 10 s)


@dataclass
class _Bounds:
    """This process's bounds (its groups are process-wide too: torch keeps them in one table)."""

    training: float = TRAIN_TIMEOUT_S
    now: float | None = None  # None: not set here, torch's defaults stand
    flag: str = "--init-timeout"  # the option that set `now`
    given: dict[int, float] = field(default_factory=dict)  # id(group) -> its bound (torch offers no reader)


_BOUNDS = _Bounds()


def start_up_timeout(init_s: float, train_s: float) -> timedelta:
    """Record both bounds of this process's run; returns the start-up one, for `init_process_group`."""
    _BOUNDS.training, _BOUNDS.now = float(train_s), float(init_s)
    _BOUNDS.flag = "--init-timeout"
    _BOUNDS.given.clear()
    return timedelta(seconds=init_s)


def apply_current_timeout() -> None:
    """Every group created since (DeepSpeed's, ours) gets the bound of the current phase."""
    if _BOUNDS.now is not None:
        _apply(_BOUNDS.now)


def use_training_timeout() -> None:
    """From now on the training bound (called after every step: a no-op once every group has it)."""
    if _BOUNDS.now is not None:
        _BOUNDS.now, _BOUNDS.flag = _BOUNDS.training, "--train-timeout"
        _apply(_BOUNDS.now)


def current_bound() -> str:
    """The bound in force now, in words: `300 s (--train-timeout)`."""
    if _BOUNDS.now is None:
        return "torch's default timeout"
    return f"{_BOUNDS.now:g} s ({_BOUNDS.flag})"


def _apply(seconds: float) -> None:
    if not torch_dist.is_initialized():
        return
    for group in list(distributed_c10d._world.pg_map):
        if _BOUNDS.given.get(id(group)) == seconds or distributed_c10d._rank_not_in_group(group):
            continue
        distributed_c10d._set_pg_timeout(timedelta(seconds=seconds), group)
        _BOUNDS.given[id(group)] = seconds
