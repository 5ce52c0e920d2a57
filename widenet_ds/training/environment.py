"""What a run configuration names, checked on the machine that runs it: the checkpoint to start from, the DeepSpeed
JSON, the compile backend, the task's data (each configuration's `data_problems`) and the output folder (free of
other runs, not locked by a running one).

A `RunConfig` checks its values only and touches no file (a launcher or a study builds one where the files may not
be); `check_run` is the one place a run looks at them, once, where it starts (widenet_ds/run/run_task.py), before any data is
read or model built, and reports every problem of the values and of the environment in one error. On several ranks
each rank's node may lack what another has (its own disks): `check_every_rank`, right after the rendezvous, says
every rank's problems at once, naming the ranks and nodes (distributed/every_rank.py).
"""

from __future__ import annotations

import torch.distributed as torch_dist

from widenet_ds.distributed.every_rank import raise_problems_of_every_rank
from widenet_ds.distributed.launch_env import expected_world_size
from widenet_ds.errors import ConfigError, raise_config_problems
from widenet_ds.fs.run_lock import folder_lock
from widenet_ds.fs.writable import check_output_folder
from widenet_ds.training.run_config import RunConfig


def check_run(cfg: RunConfig) -> None:
    """Every problem of `cfg`, its values' and its environment's, in one ConfigError; nothing when it can run.
    `cfg` may be one whose values were refused (`InvalidConfig.config`): their problems are listed with the rest.
    Started as one of several ranks with values that can work, the environment waits for `check_every_rank`."""
    values = cfg.problems()
    if values or expected_world_size() == 1:
        raise_config_problems(values + environment_problems(cfg), f"the {cfg.TASK} settings")


def check_every_rank(cfg: RunConfig) -> None:
    """Collective, after the rendezvous: every rank's environment problems, in one error printed once (the output
    folder's lock, which rank 0 takes, by rank 0 only); nothing on a single rank (`check_run` checked it)."""
    if torch_dist.get_world_size() > 1:
        raise_problems_of_every_rank(environment_problems(cfg, lock_holder=torch_dist.get_rank() == 0),
                                     f"the {cfg.TASK} settings")


def environment_problems(cfg: RunConfig, lock_holder: bool = True, data: bool = True) -> list[str]:
    """What `cfg` names that this machine lacks, each with its fix (`lock_holder`: also whether another run holds
    the output folder's lock; `data` False: all but the task's data, `cfg.data_problems()`)."""
    problems = []
    if cfg.init_from is not None and not cfg.init_from.exists():
        problems.append(f"--init-from {cfg.init_from} does not exist; pass a checkpoint folder (`widenet-ds convert "
                        f"to-folder`), a DeepSpeed checkpoint or a run folder.")
    if not cfg.deepspeed_config.is_file():
        problems.append(f"DeepSpeed config {cfg.deepspeed_config} does not exist; pass --deepspeed-config with a "
                        f"JSON file, e.g. ds_configs/{cfg.EXAMPLE_DS_CONFIG} (see ds_configs/README.md).")
    if cfg.compile != "none":
        problems += compile_backend_problems(cfg.compile_backend)
    return problems + (cfg.data_problems() if data else []) + output_dir_problems(cfg, lock_holder)


def compile_backend_problems(backend: str) -> list[str]:
    """torch.compile takes any string and fails on an unknown backend only at the first step, after the model
    and the engine were built."""
    import torch._dynamo  # only for runs that compile: the import takes seconds

    if backend in torch._dynamo.list_backends(exclude_tags=()):  # torch's debugging backends too
        return []
    # Named: the backends torch lists for users, and the kernel-free one our help names.
    shown = sorted({*torch._dynamo.list_backends(), "aot_eager"})
    return [f"--compile-backend {backend!r} is not a torch.compile backend; choose one of {', '.join(shown)}."]


def output_dir_problems(cfg: RunConfig, lock_holder: bool = True) -> list[str]:
    """A folder holding an earlier run is never written into unless that run is to be continued."""
    try:
        check_output_folder(cfg.output_dir, "--output-dir", subfolders=("checkpoints", "tensorboard"))
    except ConfigError as err:
        return [str(err)]
    writer = folder_lock(cfg.output_dir, cfg.TASK).holder_problem() if lock_holder else None  # another run writes it
    if writer:
        return [writer]
    held = cfg.folder.holds()
    if held and cfg.resume is None:
        return [f"--output-dir {cfg.output_dir} already holds a run ({', '.join(held)}); pass --resume to "
                f"continue it, or choose another --output-dir (nothing was changed there)."]
    return []
