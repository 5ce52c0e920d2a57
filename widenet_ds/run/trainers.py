"""What trains each task, keyed by the class of its settings: the one list of the tasks' trainers (the table of
their names, widenet_ds/tasks/, is torch-free; this is the half that imports the training code, as torchtitan's
models/__init__.py imports every model). A task trains as one run of its `Task`, or, finetuning, as a sweep of
`FinetuneTask`s over the seeds on what it finetunes on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as torch_dist

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.distributed.console import say
from widenet_ds.run.sweep import SeedSweep
from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.classify.task import ClassifyTask
from widenet_ds.tasks.finetune.finetuning import Finetuning
from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.glue.finetuning import GlueFinetuning
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.pretrain.task import PretrainTask
from widenet_ds.tasks.squad.config import SquadConfig
from widenet_ds.tasks.squad.finetuning import SquadFinetuning
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


TRAINERS: dict[type[RunConfig], Train] = {
    PretrainConfig: OneRun(PretrainTask),
    GlueConfig: OverSeeds(GlueFinetuning),
    SquadConfig: OverSeeds(SquadFinetuning),
    ClassifyConfig: OneRun(ClassifyTask),
}
