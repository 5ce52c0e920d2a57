"""The training tasks, each named once: its command-line name, its run configuration, the class that trains it,
its one-line description, the report's kind of run and the type of its results.json. `python -m widenet_ds.train`,
`widenet-ds launch`, the run folder (which task trained here), the report, `launcher.sh` and `slurm/train.sbatch`
take their task lists from `TASKS` (tests/test_task_registry.py checks each of them). A new task is one module
plus one row.

Imports neither torch nor DeepSpeed (the run folder and the report read `TASKS` on machines that only have
run folders): the configuration and trainer classes are named as "module:Class" of `widenet_ds.training`
and imported only when the training layer asks for them (`config_class()`, `task_class()`), as a package's
entry points are; the results classes (widenet_ds/results.py, torch-free too) are named directly.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

from widenet_ds.results import ClassifyResults, FinetuneResults, PretrainResults

TRAINING = "widenet_ds.training"  # the package of every task's configuration and trainer
ReportKind = Literal["pretrain", "finetune", "classify"]  # the report's sections (report/metrics.py's runs)
RESULTS: dict[str, type] = {"pretrain": PretrainResults, "finetune": FinetuneResults, "classify": ClassifyResults}


@dataclass(frozen=True)
class TaskSpec:
    """One training task."""

    name: str          # `python -m widenet_ds.train NAME`, run_config.json's "task"
    description: str   # one line of `python -m widenet_ds.train --help`
    report_kind: ReportKind
    config: str        # "module:Class" in widenet_ds.training of its RunConfig subclass
    task: str          # "module:Class" in widenet_ds.training: a trainer Task (one run) or a finetuning TaskRun
                       # (one run per seed)

    @property
    def results(self) -> type:
        """The dataclass of its results.json (widenet_ds/results.py): one per report kind."""
        return RESULTS[self.report_kind]

    def config_class(self) -> Any:
        return _load(self.config)

    def task_class(self) -> Any:
        return _load(self.task)


def _load(reference: str) -> Any:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(f"{TRAINING}.{module}"), name)


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("pretrain", "WideNet / ALBERT / BERT MLM + sentence-order pretraining on a prepared data folder.",
             "pretrain", "run_config:PretrainConfig", "pretraining:PretrainTask"),
    TaskSpec("glue", "Finetuning on a GLUE task (seeds, median of each metric).",
             "finetune", "run_config:GlueConfig", "finetune_tasks:GlueTaskRun"),
    TaskSpec("squad", "Finetuning on SQuAD v1.1 / v2.0 (predictions.json, null_odds.json for v2.0).",
             "finetune", "run_config:SquadConfig", "finetune_tasks:SquadTaskRun"),
    TaskSpec("classify", "ViT-WideNet / ViT / ViT-MoE / ParaFormer image classification (docs/vision.md).",
             "classify", "run_config:ClassifyConfig", "classification:ClassifyTask"),
)}
