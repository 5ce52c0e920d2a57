"""Process-group set-up in one place. Every MoE forward needs an initialised group (DeepSpeed's
all-to-all runs even with ep_size 1), so a single process gets a 1-rank gloo group."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch
import torch.distributed as torch_dist

from widenet_ds.distributed.collective_timeouts import start_up_timeout
from widenet_ds.distributed.launch_env import (
    LaunchEnv,
    abort_mpi_job,
    busy_port_error,
    resolve_launch_env,
)
from widenet_ds.engine.extensions import (
    pending_build,
    use_environment_extensions_dir,
    use_environment_ninja,
)


def init_distributed(backend: str | None = None, say: Callable[[str], None] | None = None,
                     timeouts_s: tuple[float, float] | None = None) -> None:
    """Initialise torch.distributed through DeepSpeed, whatever started us.

    The `deepspeed` launcher, torchrun, `mpiexec`, Slurm's `srun` and a plain `python` are all
    resolved by `resolve_launch_env` into the `env://` variables first, so DeepSpeed never falls
    back to its own MPI discovery (fixed port 29500). A rendezvous port another program holds is one error
    naming it. `say` gets a line when the start-up will wait for a JIT build of DeepSpeed's op. `timeouts_s`: how
    long a collective may wait during start-up and during training (distributed/collective_timeouts.py); None: torch's
    default.
    """
    if torch_dist.is_available() and torch_dist.is_initialized():
        return
    extensions = use_environment_extensions_dir()  # before DeepSpeed builds anything
    use_environment_ninja()
    import deepspeed

    env = resolve_launch_env()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo" and say is not None and (line := pending_build(extensions)):
        say(line)
    # DeepSpeed prints "... built successfully" for its shared-memory op on every rank: kept off the console.
    timeout = {} if timeouts_s is None else {"timeout": start_up_timeout(*timeouts_s)}
    with contextlib.redirect_stdout(io.StringIO()), rendezvous_port_errors(env):
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False, **timeout)
    # Tear the groups down before interpreter exit (and, under mpiexec, before mpi4py's MPI_Finalize,
    # registered earlier so run later): left to static destructors, gloo's threads abort ~1 exit in 10.
    atexit.register(_destroy_process_groups)


@contextlib.contextmanager
def rendezvous_port_errors(env: LaunchEnv) -> Iterator[None]:
    """Rank 0 serves the rendezvous (torch's TCPStore) on MASTER_PORT. A port another program holds is one error
    naming it, not torch's EADDRINUSE traceback. The bind itself is the check: a port found free by a probe can be
    taken before the bind (two runs started in the same second with one MASTER_PORT)."""
    try:
        yield
    except torch_dist.DistNetworkError as err:
        if env.rank != 0 or "EADDRINUSE" not in str(err):
            raise
        raise busy_port_error(env) from None


def _destroy_process_groups() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def exit_rank(status: int) -> NoReturn:
    """End a rank's process once its work is done: the atexit handlers (process groups torn down, MPI
    finalised, logging flushed), the console streams flushed, then `os._exit`, skipping interpreter
    finalisation. During finalisation a C++ thread that takes the GIL back (gloo's workers releasing tensors,
    pytorch/pytorch#179291) is ended by Python in the middle of C++ code and the process aborts ("terminate
    called without an active exception", SIGABRT) after a finished run: rare, but CI saw it. A rank that failed
    (status 1: a lost peer, a collective out of time) under an MPI launcher ends the whole job instead, before the
    handlers (MPI_Finalize would wait for the peer that is gone)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if status == 1:
        abort_mpi_job(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


# --- small collectives of Python values (gloo or NCCL alike), no-ops without a group of several ranks ---
def _several_ranks() -> bool:
    return torch_dist.is_initialized() and torch_dist.get_world_size() > 1


def barrier() -> None:
    if _several_ranks():
        torch_dist.barrier()


def rank0_value(value: Any) -> Any:
    """Rank 0's `value`, on every rank (what rank 0 alone found out: a lock it could not take, a full disk)."""
    if not _several_ranks():
        return value
    box = [value]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def all_values(value: Any) -> list[Any]:
    """Every rank's `value` that is not None, in rank order, on every rank (what went wrong where)."""
    if not _several_ranks():
        return [value] if value is not None else []
    values: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(values, value)
    return [v for v in values if v is not None]
