"""What trains each task (widenet_ds/run/trainers.py): every row of the task table (widenet_ds/tasks/) names a class
of its own package that trains it, into the results type of the row, and every task implements every hook the
planner and the loop call."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from widenet_ds.run.sweep import SeedSweep
from widenet_ds.run.trainers import OneRun, OverSeeds, trainer_of
from widenet_ds.tasks import TASKS
from widenet_ds.tasks.finetune.finetuning import Finetuning
from widenet_ds.tasks.finetune.task import FinetuneTask
from widenet_ds.training.task import Task

FINETUNING_HOOKS = [name for name, value in vars(Finetuning).items() if callable(value) and not name.startswith("_")]


@pytest.mark.parametrize("name", TASKS)
def test_every_row_names_a_trainer_of_its_own_package(name):
    spec = TASKS[name]
    module, _, cls = spec.trains.partition(":")
    assert cls and module.rsplit(".", 1)[0] == spec.config.__module__.rsplit(".", 1)[0], spec.trains
    trainer = trainer_of(name)
    trains = trainer.task if isinstance(trainer, OneRun) else trainer.finetuning
    assert (trains.__module__, trains.__name__) == (module, cls)


@pytest.mark.parametrize("name", TASKS)
def test_every_task_writes_the_results_type_of_its_row(name):
    spec = TASKS[name]
    trainer = trainer_of(name)
    if isinstance(trainer, OverSeeds):  # the seeds' trainers write SeedResults; the sweep the summary
        task = FinetuneTask
        assert get_type_hints(SeedSweep.run)["return"] == spec.results | None
        missing = [hook for hook in FINETUNING_HOOKS if not callable(getattr(trainer.finetuning, hook, None))]
        assert FINETUNING_HOOKS and not missing, f"{trainer.finetuning.__name__} is no Finetuning: it lacks {missing}"
        assert isinstance(trainer.finetuning.model_class, type)
    else:
        assert isinstance(trainer, OneRun)
        task = trainer.task
        assert task.RESULTS is spec.results
    assert issubclass(task, Task) and get_type_hints(task.finish)["return"] is task.RESULTS


@pytest.mark.parametrize("name", TASKS)
def test_every_task_implements_every_abstract_hook(name):
    trainer = trainer_of(name)
    task = trainer.task if isinstance(trainer, OneRun) else FinetuneTask
    assert not getattr(task, "__abstractmethods__", ()), f"{task.__name__} leaves {task.__abstractmethods__} abstract"
    assert isinstance(task.METRICS, type) and isinstance(task.RESULTS, type)
