"""What trains each task (widenet_ds/training/registry.py): one entry for every task of the table
(widenet_ds/tasks/), each training into the results type of its row."""

from __future__ import annotations

from typing import get_type_hints

from widenet_ds.tasks import TASKS
from widenet_ds.training.finetuning import FinetuneTask
from widenet_ds.training.registry import TRAINERS
from widenet_ds.training.sweep import SeedSweep
from widenet_ds.training.task import Task


def test_every_task_of_the_table_has_what_trains_it():
    assert list(TRAINERS) == [spec.config for spec in TASKS.values()]


def test_every_task_writes_the_results_type_of_its_row():
    for name, spec in TASKS.items():
        training = TRAINERS[spec.config]
        task = training.task
        assert issubclass(task, Task) and get_type_hints(task.finish)["return"] is task.RESULTS, name
        # run.py trains one Task per run, and a finetuning benchmark as a sweep of FinetuneTasks over seeds
        assert (training.benchmark is not None) == (task is FinetuneTask), name
        if training.benchmark is not None:  # the seeds' trainers write SeedResults; the sweep the summary
            assert get_type_hints(SeedSweep.run)["return"] == spec.results | None, name
        else:
            assert task.RESULTS is spec.results, name
