"""Running a training task: every problem of its settings and of what they name on this machine, at once
(training/environment.py); then the stop signals (a preemption during start-up stops the run at its first
step, saved; a TERM during the rendezvous ends the rank at once), the process group with bounded waits, every
rank's own problems said once, the watch on the peers (distributed/peer_watch.py), the output folder's lock
(one writer per run folder), the checkpoint to start from checked file by file, every other check, then the
one trainer (finetuning: one trainer per seed)."""

from __future__ import annotations

import os
import signal
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch.distributed as torch_dist

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.distributed.console import say
from widenet_ds.distributed.groups import all_values, init_distributed, rank0_value
from widenet_ds.distributed.peer_watch import stop_watching, watch_peers
from widenet_ds.engine.extensions import announce_op_builds
from widenet_ds.errors import ConfigError, WideNetError, mark_same_on_every_rank
from widenet_ds.fs.disk_space import DiskFullError
from widenet_ds.fs.run_lock import FolderLockedError, folder_lock
from widenet_ds.run.trainers import trainer_of
from widenet_ds.training.environment import check_every_rank, check_run
from widenet_ds.training.preemption import StopRequest
from widenet_ds.training.run_config import LATEST, RunConfig


def run_task(cfg: RunConfig) -> Any:
    """Train `cfg`'s task; its results (None: stopped by a signal, saved; `--resume` continues). A `cfg` whose
    values were refused (`InvalidConfig.config`) is refused here with its environment's problems too."""
    try:
        check_run(cfg)
    except WideNetError as err:  # every rank reads the same settings and the same (shared) files
        raise mark_same_on_every_rank(err)
    if cfg.resume == LATEST and cfg.folder.resumable() is None:  # never silent (a requeued job's first start)
        say(f"--resume: nothing to continue in {cfg.output_dir} (no checkpoint yet): starting a new run "
            + (f"from --init-from {cfg.init_from}" if cfg.init_from is not None else "from step 1"))
    stop = StopRequest()
    # Slurm's USR1 (slurm/requeue.sh) is kept from the start: the run stops at its first step, saved, and requeues.
    # TERM only once the process group is up: a rank blocked in the rendezvous (rank 0 refused a busy port, a peer
    # never came) runs no Python handler, and the launcher's TERM must end it there, not its SIGKILL 30 s later.
    stop.install(signal.SIGUSR1)
    try:
        say("starting: initialising the process group")
        announce_op_builds(say)  # a first run's op builds (shared memory, fused_adam, ...) are said as they happen
        init_distributed(say=say, timeouts_s=(cfg.init_timeout, cfg.train_timeout))
        check_every_rank(cfg)  # each node's own problems, said once for all ranks before any rank goes on
        stop.install(signal.SIGTERM)
        watch_peers(cfg.output_dir / "checkpoints", trainer_command(cfg))
        with run_folder_lock(cfg):
            check_shared_output(cfg.output_dir)
            init_source = None
            if cfg.init_from is not None:
                try:  # resolved once; a damaged file is named before any rank reads the weights
                    init_source = CheckpointSource.open(cfg.init_from, "--init-from")
                except WideNetError as err:
                    raise mark_same_on_every_rank(err)
            say(f"{torch_dist.get_world_size()} rank(s); checking the data, model config and DeepSpeed JSON")
            result = trainer_of(cfg.TASK)(cfg, init_source, stop)  # (finetuning: one trainer per seed)
            # Every rank leaves together: a rank tearing its gloo group down while another still writes the
            # results (rank 0) aborts at exit ("terminate called without an active exception"). No watch after it:
            # the rendezvous store it beats into ends with rank 0.
            stop_watching()
            torch_dist.barrier()
        return result
    finally:
        stop_watching()
        stop.uninstall()


def trainer_command(cfg: RunConfig) -> str:
    """The command a rank of this run runs, as the peers' watch and the folder's lock name it."""
    return f"python -m widenet_ds.train {cfg.TASK}"


def check_shared_output(folder: Path, wait_s: float = 5.0, named: str | None = None) -> None:
    """Collective: every rank sees what rank 0 writes in the run folder. Every rank writes its part of a checkpoint
    there and rank 0 completes it (checkpoint/manager.py), so an --output-dir on node-local storage would leave
    each node a different, incomplete checkpoint (measured on the 2-node test cluster: rank 1's files stayed in
    `step3.partial` on node 2, and a --resume hung); refused before anything is built. `named`: how the message names
    the folder (default `--output-dir FOLDER`; the preflight's scratch folder stands for the run folder)."""
    if torch_dist.get_world_size() == 1:
        return
    probe = Path(folder) / rank0_value(f".widenet-ds-shared-{socket.gethostname()}-{os.getpid()}")
    if torch_dist.get_rank() == 0:
        probe.write_text(socket.gethostname())
    torch_dist.barrier()
    deadline = time.monotonic() + wait_s  # a shared file system may show a new file a moment later
    while not probe.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    blind = all_values(None if probe.is_file() else f"rank {torch_dist.get_rank()} on {socket.gethostname()}")
    torch_dist.barrier()
    if torch_dist.get_rank() == 0:
        probe.unlink(missing_ok=True)
    if blind:
        raise mark_same_on_every_rank(ConfigError(
            f"{named or f'--output-dir {folder}'} is not one folder for all ranks: {', '.join(blind)} does not see the "
            f"file rank 0 on {rank0_value(socket.gethostname())} wrote there. Every rank writes its part of each "
            f"checkpoint into the run folder and rank 0 completes it, so it must be on storage every node mounts at "
            f"the same path (a shared file system); node-local disks would leave each node an incomplete checkpoint."))


@contextmanager
def run_folder_lock(cfg: RunConfig) -> Iterator[None]:
    """Rank 0 holds the lock of --output-dir for the whole run (also on several nodes: one lock); every rank
    learns whether it got it, so a refusal (another writer, a disk too full for the lock file) is one error on
    all of them, printed once."""
    lock = folder_lock(cfg.output_dir, trainer_command(cfg))
    refusal = None
    if torch_dist.get_rank() == 0:
        try:
            lock.acquire()
        except (FolderLockedError, DiskFullError) as err:
            refusal = err
    refusal = rank0_value(refusal)
    if refusal is not None:
        raise mark_same_on_every_rank(refusal)
    if lock.takeover_message:
        say(lock.takeover_message)
    try:
        yield
    finally:
        lock.release()
