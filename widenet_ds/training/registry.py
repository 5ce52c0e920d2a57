"""The training tasks, each one row: its settings (a `RunConfig` subclass: its TASK is the name `python -m
widenet_ds.train NAME` takes and run_config.json records, its DESCRIPTION the task's line of `--help`), the `Task`
that trains it, the type of its results.json, and for finetuning the benchmark its seed sweep runs. `python -m widenet_ds.train`,
`widenet-ds launch`, the run folder, the report, `launcher.sh` and `slurm/train.sbatch` list the same tasks
(tests/training/test_registry.py checks each of them; the torch-free layers read the names and results types from
`widenet_ds.results.TASK_RESULTS`, tested equal). A new task is one module plus one row.
"""

from __future__ import annotations

from dataclasses import dataclass

from widenet_ds.results import ClassifyResults, FinetuneResults, PretrainResults, Results
from widenet_ds.training.benchmark import Benchmark, GlueBenchmark, SquadBenchmark
from widenet_ds.training.classification import ClassifyTask
from widenet_ds.training.finetuning import FinetuneTask
from widenet_ds.training.pretraining import PretrainTask
from widenet_ds.training.run_config import ClassifyConfig, GlueConfig, PretrainConfig, RunConfig, SquadConfig
from widenet_ds.training.task import Task


@dataclass(frozen=True)
class TaskSpec:
    """One training task."""

    config: type[RunConfig]   # its settings; `config.TASK` is its name
    task: type[Task]          # what trains one run of it (finetuning: one seed)
    results: type[Results]    # its results.json (finetuning: the sweep's summary of the seeds)
    benchmark: type[Benchmark] | None = None  # finetuning: the run is a sweep of `task` over seeds on this benchmark

    @property
    def name(self) -> str:
        return self.config.TASK

    @property
    def description(self) -> str:
        """One line of `python -m widenet_ds.train --help`."""
        return self.config.DESCRIPTION


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec(PretrainConfig, PretrainTask, PretrainResults),
    TaskSpec(GlueConfig, FinetuneTask, FinetuneResults, benchmark=GlueBenchmark),
    TaskSpec(SquadConfig, FinetuneTask, FinetuneResults, benchmark=SquadBenchmark),
    TaskSpec(ClassifyConfig, ClassifyTask, ClassifyResults),
)}
