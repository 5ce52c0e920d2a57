"""Where this process sits in the job: rank, local rank, world size and rendezvous address.

One resolver for every way a user starts us, tried in this order:
  1. a torch-style launcher already set RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
     (`deepspeed`, `torchrun`);
  2. an MPI launcher (`mpiexec`/`mpirun`: PMI_RANK for MPICH/Intel MPI, OMPI_COMM_WORLD_RANK for
     Open MPI) - rank 0's address and a free port are shared over mpi4py;
  3. a Slurm job step (`srun` inside `sbatch`/`salloc`): SLURM_PROCID/LOCALID/NTASKS, the first
     host of the step's node list, a port derived from the job id;
  4. a plain `python script.py`: one rank on 127.0.0.1.
MPI comes before Slurm because `mpiexec` inside an allocation also sees SLURM_* variables that
describe its helper processes, not the ranks; `srun --mpi=pmi2` (same ranks in both) stays Slurm.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import subprocess
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

from widenet_ds.distributed.ports import free_port, port_holder
from widenet_ds.errors import LaunchError, mark_same_on_every_rank

TORCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Slurm jobs share nodes: a port per job and per requeue (16 restarts before a job's ports repeat;
# a restarted job never meets its predecessor's socket in TIME_WAIT) keeps jobs on a node apart.
SLURM_PORT_BASE, SLURM_PORT_SPAN, SLURM_PORTS_PER_JOB = 20000, 20000, 16


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    source: str  # "launcher", "mpi", "slurm" or "single"
    nodes: int = 1  # the hosts the ranks run on, where the launch says (Slurm, MPI); 1 where it does not

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise LaunchError(f"rank {self.rank} is outside world size {self.world_size} "
                              f"(from {self.source}); check the launcher's rank variables")
        if not 0 <= self.local_rank < self.world_size:
            raise LaunchError(f"local rank {self.local_rank} is outside world size {self.world_size} "
                              f"(from {self.source}); check the launcher's local-rank variables")
        if not 0 < self.master_port < 65536:
            raise LaunchError(f"MASTER_PORT {self.master_port} is not a TCP port; set MASTER_PORT=1024..65535")

    def export(self, environ: MutableMapping[str, str]) -> None:
        """Write the torch.distributed `env://` variables (what `init_process_group` reads)."""
        environ.update(RANK=str(self.rank), LOCAL_RANK=str(self.local_rank), WORLD_SIZE=str(self.world_size),
                       MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))


def resolve_launch_env(environ: MutableMapping[str, str] | None = None) -> LaunchEnv:
    """Resolve the rank environment (see the module docstring) and export it into `environ`.

    `environ` defaults to `os.environ`; afterwards it holds RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT, so `deepspeed.init_distributed()` and torch's `env://` agree with it.
    """
    environ = os.environ if environ is None else environ
    # MASTER_ADDR/MASTER_PORT alone are the user's rendezvous choice (honoured below); a rank
    # variable means a launcher already placed this process.
    if any(name in environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        env = _from_launcher(environ)
    elif _mpi_rank_size(environ) is not None and not _slurm_step_matches_mpi(environ):
        env = _from_mpi(environ)
    elif "SLURM_JOB_ID" in environ:
        env = _from_slurm(environ)
    else:
        env = _single(environ, source="single")
    env.export(environ)
    if env.nodes > 1:  # after the export: the rank is known, so the error is printed once (by rank 0)
        check_rendezvous_address(env.master_addr, env.nodes, "MASTER_ADDR", "unset MASTER_ADDR, and the first host "
                                 "of the job is used" if env.source == "slurm" else "unset MASTER_ADDR, and rank 0's "
                                 "address is used")
    return env


def expected_world_size(environ: MutableMapping[str, str] | None = None) -> int:
    """How many ranks the run will have, read from the launchers' variables as `resolve_launch_env` would, but
    without starting anything (no mpi4py): a check before the rendezvous knows whether this process is alone."""
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" in environ:
        return _int_var(environ, "WORLD_SIZE", "the launcher environment")
    mpi = _mpi_rank_size(environ)
    if mpi is not None and not _slurm_step_matches_mpi(environ):
        return mpi[1]
    if "SLURM_JOB_ID" in environ and "SLURM_STEP_ID" in environ:
        return _slurm_step_tasks(environ) or 1
    return 1


def _single(environ: MutableMapping[str, str], source: str) -> LaunchEnv:
    addr, port = _rendezvous_override(environ)
    return LaunchEnv(rank=0, local_rank=0, world_size=1, master_addr=addr or "127.0.0.1",
                     master_port=port or free_port(), source=source)


def _rendezvous_override(environ: MutableMapping[str, str]) -> tuple[str | None, int | None]:
    port = _int_var(environ, "MASTER_PORT", "the environment") if "MASTER_PORT" in environ else None
    return environ.get("MASTER_ADDR") or None, port


def _int_var(environ: MutableMapping[str, str], name: str, source: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} set by {source} is not an integer; unset it or fix the "
                          f"launcher that sets it") from None


def _from_launcher(environ: MutableMapping[str, str]) -> LaunchEnv:
    missing = [name for name in TORCH_VARS if name not in environ]
    if missing:
        present = [name for name in TORCH_VARS if name in environ]
        raise LaunchError(
            f"{', '.join(present)} set but {', '.join(missing)} missing: a launcher sets all of "
            f"{', '.join(TORCH_VARS)}. Start the job with `deepspeed`/`torchrun`, or unset the partial "
            f"variables to let Slurm/MPI/single-process detection run")
    src = "the launcher environment"
    return LaunchEnv(rank=_int_var(environ, "RANK", src), local_rank=_int_var(environ, "LOCAL_RANK", src),
                     world_size=_int_var(environ, "WORLD_SIZE", src), master_addr=environ["MASTER_ADDR"],
                     master_port=_int_var(environ, "MASTER_PORT", src), source="launcher")


# ---- MPI -------------------------------------------------------------------------------------

MPI_RANK_SIZE_VARS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))


def _mpi_rank_size(environ: MutableMapping[str, str]) -> tuple[int, int] | None:
    for rank_var, size_var in MPI_RANK_SIZE_VARS:
        if rank_var in environ and size_var in environ:
            return _int_var(environ, rank_var, "MPI"), _int_var(environ, size_var, "MPI")
    return None


def _slurm_step_matches_mpi(environ: MutableMapping[str, str]) -> bool:
    """`srun --mpi=pmi2` sets PMI_RANK == SLURM_PROCID: Slurm alone describes those ranks."""
    mpi = _mpi_rank_size(environ)
    step = _slurm_step_tasks(environ)
    return (mpi is not None and "SLURM_STEP_ID" in environ and step is not None
            and environ.get("SLURM_PROCID") == str(mpi[0]) and step == mpi[1])


def _from_mpi(environ: MutableMapping[str, str]) -> LaunchEnv:
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise LaunchError(f"started by an MPI launcher (PMI_RANK/OMPI_COMM_WORLD_RANK set) but mpi4py "
                          f"is not importable ({err}); `pip install mpi4py mpich` or use the `deepspeed` "
                          f"launcher") from None
    comm = MPI.COMM_WORLD
    _MPI_JOB[:] = [comm]
    rank, world_size = comm.Get_rank(), comm.Get_size()
    hosts = comm.allgather(MPI.Get_processor_name())
    local_rank = hosts[:rank].count(hosts[rank])
    if rank == 0:
        # One host: loopback. Several: rank 0's first routable address (DeepSpeed's choice too).
        addr, port = _rendezvous_override(environ)
        if addr is None:
            addr = "127.0.0.1" if len(set(hosts)) == 1 else _first_address()
        rendezvous = (addr, port or free_port())
    else:
        rendezvous = None
    master_addr, master_port = comm.bcast(rendezvous, root=0)
    return LaunchEnv(rank=rank, local_rank=local_rank, world_size=world_size, master_addr=master_addr,
                     master_port=master_port, source="mpi", nodes=len(set(hosts)))


_MPI_JOB: list = []  # COMM_WORLD, when an MPI launcher placed this process


def abort_mpi_job(status: int) -> None:
    """A rank that fails under an MPI launcher ends the whole job now (MPI_Abort), and mpiexec with it: MPICH's
    hydra otherwise waits for every node's proxy to report, and the proxy of a node that vanished never does
    (mpiexec waited minutes, until TCP gave up on the node, on the 2-node test cluster, with or without ssh
    keep-alives; MPI_Abort ended it at once). Nothing without MPI."""
    if _MPI_JOB:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        _MPI_JOB[0].Abort(status)


def _first_address() -> str:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True, timeout=10).stdout
        return out.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return socket.gethostbyname(socket.gethostname())


# ---- Slurm -----------------------------------------------------------------------------------

SLURM_FIX = ("launch the ranks with `srun` inside the batch script (one task per GPU: "
             "`#SBATCH --ntasks-per-node=<GPUs>` and `srun python ...`), as slurm/train.sbatch does")


def _slurm_step_tasks(environ: MutableMapping[str, str]) -> int | None:
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if name in environ:
            return _int_var(environ, name, "Slurm")
    return None


def _from_slurm(environ: MutableMapping[str, str]) -> LaunchEnv:
    job_id = _int_var(environ, "SLURM_JOB_ID", "Slurm")
    in_step = "SLURM_STEP_ID" in environ
    ntasks = _slurm_step_tasks(environ)
    if not in_step:
        # The batch script itself (or an salloc shell): one process. Fine for a 1-task job; with more
        # tasks it means the script forgot srun and would silently train on one rank.
        if ntasks is not None and ntasks > 1:
            raise LaunchError(f"Slurm job {job_id} has {ntasks} tasks but this process was started "
                              f"without srun, so it would train alone on one rank; {SLURM_FIX}")
        return _single(environ, source="slurm")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    missing = [name for name in ("SLURM_PROCID", "SLURM_LOCALID") if name not in environ]
    missing += ["SLURM_NTASKS"] if ntasks is None else []
    missing += ["SLURM_JOB_NODELIST"] if nodelist is None else []
    if missing:
        raise LaunchError(f"Slurm step of job {job_id} lacks {', '.join(missing)}: the job was submitted "
                          f"without a task count or the variables were removed (`--export=NONE` "
                          f"scripts must re-export SLURM_*); submit with `--ntasks=N` or "
                          f"`--nodes=N --ntasks-per-node=G` and {SLURM_FIX}")
    addr, port = _rendezvous_override(environ)
    if port is None:
        restarts = _int_var(environ, "SLURM_RESTART_COUNT", "Slurm") if "SLURM_RESTART_COUNT" in environ else 0
        port = SLURM_PORT_BASE + (job_id * SLURM_PORTS_PER_JOB + restarts % SLURM_PORTS_PER_JOB) % SLURM_PORT_SPAN
    nodes = next((_int_var(environ, name, "Slurm") for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
                  if name in environ), 1)
    return LaunchEnv(rank=_int_var(environ, "SLURM_PROCID", "Slurm"),
                     local_rank=_int_var(environ, "SLURM_LOCALID", "Slurm"), world_size=ntasks,
                     master_addr=addr or first_host(nodelist), master_port=port, source="slurm", nodes=nodes)


def first_host(nodelist: str) -> str:
    """First host of a Slurm host list: "gpu[07-09,12],cpu1" -> "gpu07" (same as `scontrol show hostnames`)."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        raise LaunchError(f"cannot read a host from Slurm node list {nodelist!r}; set MASTER_ADDR to the "
                          f"first node's address in the batch script")
    prefix, ranges = match.groups()
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


# ---- the rendezvous address and port ---------------------------------------------------------

def is_loopback(address: str) -> bool:
    """Whether `address` (a name or an IP) is this machine's loopback wherever it is resolved."""
    try:
        found = socket.getaddrinfo(address, None)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in found)


def routable_address(host: str) -> str | None:
    """`host`'s first address that is not a loopback one, as resolved here (None: none)."""
    try:
        found = socket.getaddrinfo(host, None, socket.AF_INET)
    except (socket.gaierror, UnicodeError):
        return None
    return next((info[4][0] for info in found if not ipaddress.ip_address(info[4][0]).is_loopback), None)


def check_rendezvous_address(address: str, nodes: int, option: str, fix: str, first: str | None = None) -> None:
    """Refuse a loopback rendezvous address for ranks on several nodes: on each node it is that node itself, so
    every rank outside rank 0's node would wait for a rendezvous it never reaches (the init timeout, or for ever).
    `first`: rank 0's host, where known; `fix`: the other way out (leave the option out)."""
    if nodes < 2 or not is_loopback(address):
        return
    use = ""
    if first is not None and (reach := routable_address(first)) is not None:
        use = f"Use {first} ({reach}), the address the other nodes reach rank 0's node by, or "
    elif first is not None:
        use = (f"Use the address the other nodes reach rank 0's node, {first}, by ({first} itself resolves to a "
               f"loopback address here), or ")
    raise mark_same_on_every_rank(LaunchError(
        f"{option} {address} is a loopback address, and the ranks run on {nodes} nodes: on each node it names that "
        f"node itself, so the ranks outside rank 0's node would wait for a rendezvous they never reach. "
        f"{use}{fix if use else fix[:1].upper() + fix[1:]}."))



def busy_port_error(env: LaunchEnv) -> LaunchError:
    """Rank 0 could not serve the rendezvous on its port: the error naming the program that holds it and how the
    port was chosen, so the user knows what to change."""
    other = free_port()
    how = {"launcher": f"it was given to the launcher (--master_port / --master-port, else deepspeed's default 29500): "
                       f"start again with another port, e.g. `widenet-ds launch --master-port {other} ...` (without "
                       f"--master-port widenet-ds launch picks a free one) or `deepspeed --master_port {other} ...`",
           "slurm": f"it is derived from the Slurm job id: set MASTER_PORT={other} (a free port) in the batch script",
           }.get(env.source, f"it was set by MASTER_PORT: set another (e.g. MASTER_PORT={other}), or unset it to "
                             f"let a free port be chosen")
    return LaunchError(f"the rendezvous port {env.master_port} on {socket.gethostname()} is in use by "
                       f"{port_holder(env.master_port)}; rank 0 cannot serve the process group there. The port: {how}.")


def without_local_rank(argv: list[str]) -> list[str]:
    """A rank's arguments without the `--local_rank=N` the deepspeed launcher puts first (the rank comes from the
    environment)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--local_rank", "--local-rank"):
            skip = True
        elif not arg.startswith(("--local_rank=", "--local-rank=")):
            out.append(arg)
    return out
