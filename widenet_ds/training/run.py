"""Running a training task: the stop signals first (a preemption during start-up stops the run at its first
step, saved), the process group, every check, then the one trainer (finetuning: one trainer per seed)."""

from __future__ import annotations

from typing import Any

import torch.distributed as torch_dist

from widenet_ds.runtime.distributed import init_distributed
from widenet_ds.training.classification import ClassifyTask
from widenet_ds.training.console import say
from widenet_ds.training.finetuning import run_finetune
from widenet_ds.training.plan import plan_task
from widenet_ds.training.preemption import StopRequest
from widenet_ds.training.pretraining import PretrainTask
from widenet_ds.training.run_config import RunConfig
from widenet_ds.training.trainer import Task, Trainer

SINGLE_RUN_TASKS: dict[str, type[Task]] = {"pretrain": PretrainTask, "classify": ClassifyTask}


def run_task(cfg: RunConfig) -> Any:
    """Train `cfg`'s task; its results (None: stopped by a signal, saved; `--resume` continues)."""
    stop = StopRequest()
    stop.install()
    try:
        say("starting: initialising the process group")
        init_distributed()
        if cfg.TASK in SINGLE_RUN_TASKS:
            result = run_single(cfg, SINGLE_RUN_TASKS[cfg.TASK](cfg), stop)
        else:
            result = run_finetune(cfg, stop)
        # Every rank leaves together: a rank tearing its gloo group down while another still writes the
        # results (rank 0) aborts at exit ("terminate called without an active exception").
        torch_dist.barrier()
        return result
    finally:
        stop.uninstall()


def run_single(cfg: RunConfig, task: Task, stop: StopRequest) -> Any:
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    say(f"{world} rank(s); checking the data, model config and DeepSpeed JSON")
    plan = plan_task(cfg, task, cfg.folder, world, rank, check_settings=True)
    model = plan.model_config
    say(f"building the model ({model.num_layers} blocks, hidden {model.hidden_size})")
    finished, result = Trainer(cfg, task, plan, cfg.folder, stop).run()
    return result if finished else None
