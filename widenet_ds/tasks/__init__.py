"""The training tasks, one package each (finetune/ holds what the finetuning tasks share), and one row each in the one
table of their names. A row is the task's settings (a `RunConfig` subclass: its TASK is the name `python -m
widenet_ds.train NAME` takes and run_config.json records, its DESCRIPTION the task's line of `--help`), the type of
its results.json, and what trains it, named by its import path (the run layer imports it: widenet_ds/run/trainers.py).
`python -m widenet_ds.train`, `widenet-ds launch`, the run folder's readers and the report list and tell apart the
tasks from here. A new task is its package and its row here.

Imports neither torch nor DeepSpeed (the settings and results are plain values, the trainer a name): the launcher
and the report read it on machines that only have run folders.
"""

from __future__ import annotations

from dataclasses import dataclass

from widenet_ds.errors import RunFolderError
from widenet_ds.run_folder import OLD_VISION_CONFIG_FILE, RunFolder, read_json
from widenet_ds.tasks.classify.config import ClassifyConfig
from widenet_ds.tasks.classify.results import ClassifyResults
from widenet_ds.tasks.finetune.results import FinetuneResults
from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.pretrain.config import PretrainConfig
from widenet_ds.tasks.pretrain.results import PretrainResults
from widenet_ds.tasks.squad.config import SquadConfig
from widenet_ds.tasks.text_classification.config import TextClassificationConfig
from widenet_ds.training.run_config import RunConfig


@dataclass(frozen=True)
class TaskSpec:
    """One training task."""

    config: type[RunConfig]  # its settings; `config.TASK` is its name
    results: type[PretrainResults | ClassifyResults | FinetuneResults]  # its results.json (finetuning: the seeds')
    # "module:Class" in the task's package: a `Task` (trained as one run) or a `Finetuning` (a sweep over the seeds);
    # a name, not the class, as the class imports torch
    trains: str

    @property
    def name(self) -> str:
        return self.config.TASK

    @property
    def description(self) -> str:
        """One line of `python -m widenet_ds.train --help`."""
        return self.config.DESCRIPTION


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec(PretrainConfig, PretrainResults, "widenet_ds.tasks.pretrain.task:PretrainTask"),
    TaskSpec(GlueConfig, FinetuneResults, "widenet_ds.tasks.glue.finetuning:GlueFinetuning"),
    TaskSpec(SquadConfig, FinetuneResults, "widenet_ds.tasks.squad.finetuning:SquadFinetuning"),
    TaskSpec(ClassifyConfig, ClassifyResults, "widenet_ds.tasks.classify.task:ClassifyTask"),
    TaskSpec(TextClassificationConfig, FinetuneResults,
             "widenet_ds.tasks.text_classification.finetuning:TextClassificationFinetuning"),
)}


def task_of(folder: RunFolder) -> str | None:
    """The task that trained in `folder`: the one run_config.json names; for folders without one (written before one
    trainer ran every task), what their files say (seed folders: finetuning; vision_config.json or a results.json
    naming a dataset: images; metrics only: pretraining); None when the folder holds no run."""
    recorded = folder.recorded_task()
    if recorded in TASKS:
        return recorded
    if folder.seeds():
        return "glue"
    if (folder.path / OLD_VISION_CONFIG_FILE).is_file():
        return "classify"
    if folder.results.is_file():
        try:  # which shape: only image results name a dataset
            results = read_json(folder.results, "the run's results")
        except RunFolderError:
            results = {}
        if isinstance(results, dict) and "dataset" in results:
            return "classify"
    if folder.metrics.is_file():
        return "pretrain"
    return None
