"""What trains each task: the class its row of the task table (widenet_ds/tasks/) names by its import path, imported
here (the table is torch-free; the class imports the training code). A `Task` trains as one run; a `Finetuning`
(what a finetuning task finetunes on) as a sweep of `FinetuneTask`s over the seeds."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as torch_dist

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.distributed.console import say
from widenet_ds.run.sweep import SeedSweep
from widenet_ds.tasks import TASKS
from widenet_ds.tasks.finetune.finetuning import Finetuning
from widenet_ds.training.plan import plan_task
from widenet_ds.training.preemption import StopRequest
from widenet_ds.training.run_config import RunConfig
from widenet_ds.training.task import Task
from widenet_ds.training.trainer import Trainer

# (the run's settings, the --init-from checkpoint opened once, the stop request) -> its results (None: stopped)
Train = Callable[[RunConfig, CheckpointSource | None, StopRequest], Any]


@dataclass(frozen=True)
class OneRun:
    """A task trained as one run of `task` in the run folder: planned, then trained."""

    task: type[Task]

    def __call__(self, cfg: RunConfig, init_source: CheckpointSource | None, stop: StopRequest) -> Any:
        task = self.task(cfg, cfg.folder, init_source)
        plan = plan_task(cfg, task, torch_dist.get_world_size(), torch_dist.get_rank())
        model = plan.model_config
        say(f"building the model ({model.num_layers} blocks, hidden {model.hidden_size})")
        finished, result = Trainer(cfg, task, plan, stop).run()
        return result if finished else None


@dataclass(frozen=True)
class OverSeeds:
    """Finetuning: every seed a `FinetuneTask` run on `finetuning`, planned once (run/sweep.py)."""

    finetuning: type[Finetuning]

    def __call__(self, cfg: RunConfig, init_source: CheckpointSource | None, stop: StopRequest) -> Any:
        return SeedSweep(cfg, self.finetuning(cfg), init_source).run(stop)


def trainer_of(task: str) -> Train:
    """What trains the task named `task`: its row's class, imported."""
    module, _, name = TASKS[task].trains.partition(":")
    trains = getattr(importlib.import_module(module), name)
    return OneRun(trains) if issubclass(trains, Task) else OverSeeds(trains)
