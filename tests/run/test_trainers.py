"""What trains each task (widenet_ds/run/trainers.py): one entry for every task of the table (widenet_ds/tasks/),
each training into the results type of its row, and every task implementing every hook the planner and the loop
call."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from widenet_ds.run.sweep import SeedSweep
from widenet_ds.run.trainers import TRAINERS, OneRun, OverSeeds
from widenet_ds.tasks import TASKS
from widenet_ds.tasks.finetune.task import FinetuneTask
from widenet_ds.training.task import Task


def test_every_task_of_the_table_has_what_trains_it():
    assert list(TRAINERS) == [spec.config for spec in TASKS.values()]


@pytest.mark.parametrize("name", TASKS)
def test_every_task_writes_the_results_type_of_its_row(name):
    spec = TASKS[name]
    trainer = TRAINERS[spec.config]
    if isinstance(trainer, OverSeeds):  # the seeds' trainers write SeedResults; the sweep the summary
        task = FinetuneTask
        assert get_type_hints(SeedSweep.run)["return"] == spec.results | None
    else:
        assert isinstance(trainer, OneRun)
        task = trainer.task
        assert task.RESULTS is spec.results
    assert issubclass(task, Task) and get_type_hints(task.finish)["return"] is task.RESULTS


@pytest.mark.parametrize("name", TASKS)
def test_every_task_implements_every_abstract_hook(name):
    trainer = TRAINERS[TASKS[name].config]
    task = trainer.task if isinstance(trainer, OneRun) else FinetuneTask
    assert not getattr(task, "__abstractmethods__", ()), f"{task.__name__} leaves {task.__abstractmethods__} abstract"
    assert isinstance(task.METRICS, type) and isinstance(task.RESULTS, type)
