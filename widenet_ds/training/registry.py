"""What trains each task (widenet_ds/tasks/ lists the tasks, torch-free): keyed by the class of its settings, the
`Task` that trains one run of it, and for finetuning the benchmark its seed sweep runs."""

from __future__ import annotations

from dataclasses import dataclass

from widenet_ds.training.benchmark import Benchmark, GlueBenchmark, SquadBenchmark
from widenet_ds.training.classification import ClassifyTask
from widenet_ds.training.finetuning import FinetuneTask
from widenet_ds.training.pretraining import PretrainTask
from widenet_ds.training.run_config import ClassifyConfig, GlueConfig, PretrainConfig, RunConfig, SquadConfig
from widenet_ds.training.task import Task


@dataclass(frozen=True)
class TaskTraining:
    """How a task trains."""

    task: type[Task]  # what trains one run of it (finetuning: one seed)
    benchmark: type[Benchmark] | None = None  # finetuning: the run is a sweep of `task` over seeds on this benchmark


TRAINERS: dict[type[RunConfig], TaskTraining] = {
    PretrainConfig: TaskTraining(PretrainTask),
    GlueConfig: TaskTraining(FinetuneTask, benchmark=GlueBenchmark),
    SquadConfig: TaskTraining(FinetuneTask, benchmark=SquadBenchmark),
    ClassifyConfig: TaskTraining(ClassifyTask),
}
