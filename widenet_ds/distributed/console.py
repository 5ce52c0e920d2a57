"""Progress lines before the first step, and errors printed once for all ranks.

Building the model and initialising DeepSpeed take tens of seconds on a cold machine; a line per
phase (rank 0 only) says the run is alive. An error every rank raises alike (bad data, config, JSON:
all ranks read the same inputs) is printed by rank 0 only; an error of one rank names the rank.
"""

from __future__ import annotations

import os
import sys
import time

_START = time.monotonic()


# Where a launcher says the rank before the process group is up: torch's launchers, MPI (MPICH, Open MPI), an srun step
LAUNCHER_RANKS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def process_rank() -> int:
    torch_dist = sys.modules.get("torch.distributed")  # not imported: no process group (a light command's error)
    if torch_dist is not None and torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank()
    rank = next((os.environ[name] for name in LAUNCHER_RANKS if os.environ.get(name)), "0")
    return int(rank) if rank.isdigit() else 0


def say(message: str) -> None:
    """One progress line on rank 0's console (stderr, so stdout stays for results)."""
    if process_rank() == 0:
        print(f"[widenet-ds {time.monotonic() - _START:5.1f}s] {message}", file=sys.stderr, flush=True)


# How long another rank holding a shared error waits for rank 0 to print it: a launcher that sees a rank end ends
# the others (DeepSpeed's kills them at once), and a silent rank ending first would take rank 0's line with it.
SHARED_ERROR_GRACE_S = 5.0


def report_error(program: str, err: BaseException) -> None:
    """Print a user error once: rank 0 prints shared errors; another rank only its own, with its rank."""
    rank = process_rank()
    if rank == 0:
        print(f"{program}: error: {err}", file=sys.stderr, flush=True)
    elif not getattr(err, "same_on_every_rank", False):
        print(f"{program}: error (rank {rank}): {err}", file=sys.stderr, flush=True)
    elif int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        time.sleep(SHARED_ERROR_GRACE_S)  # rank 0 says it, exits, and its launcher ends this rank
