"""Process-group set-up in one place. Every MoE forward needs an initialised group (DeepSpeed's
all-to-all runs even with ep_size 1), so a single process gets a 1-rank gloo group."""

from __future__ import annotations

import atexit

import torch
import torch.distributed as torch_dist

from widenet_ds.runtime.launch_env import resolve_launch_env


def init_distributed(backend: str | None = None) -> None:
    """Initialise torch.distributed through DeepSpeed, whatever started us.

    The `deepspeed` launcher, torchrun, `mpiexec`, Slurm's `srun` and a plain `python` are all
    resolved by `resolve_launch_env` into the `env://` variables first, so DeepSpeed never falls
    back to its own MPI discovery (fixed port 29500).
    """
    if torch_dist.is_available() and torch_dist.is_initialized():
        return
    import deepspeed

    resolve_launch_env()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    # Tear the groups down before interpreter exit (and, under mpiexec, before mpi4py's MPI_Finalize,
    # registered earlier so run later): left to static destructors, gloo's threads abort ~1 exit in 10.
    atexit.register(_destroy_process_groups)


def _destroy_process_groups() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def rank() -> int:
    return torch_dist.get_rank() if torch_dist.is_initialized() else 0


def world_size() -> int:
    return torch_dist.get_world_size() if torch_dist.is_initialized() else 1
