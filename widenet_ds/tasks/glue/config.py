"""The settings of finetuning on a GLUE dataset: which one, and its test-set predictions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from widenet_ds.errors import ConfigError, DataError
from widenet_ds.tasks.finetune.config import FinetuneConfig
from widenet_ds.tasks.glue.datasets import FINETUNED_NAMES, get_glue_dataset, glue_split_path
from widenet_ds.training.flags import flag


@dataclass(kw_only=True)
class GlueConfig(FinetuneConfig):
    TASK: ClassVar[str] = "glue"
    DESCRIPTION: ClassVar[str] = "Finetuning on a GLUE task (seeds, median of each metric)."

    glue_task: str = field(metadata=flag(f"GLUE task name in any spelling ({' '.join(FINETUNED_NAMES)}); --task is "
                                         "the same flag", names=("--glue-task", "--task")))
    predict_test: bool = field(default=False, metadata=flag(
        "also write test-set predictions in the GLUE submission format (e.g. SST-2.tsv, MNLI-m.tsv)"))

    def problems(self) -> list[str]:
        problems = super().problems()
        try:
            task = get_glue_dataset(self.glue_task)
        except ConfigError as err:
            return problems + [f"--glue-task: {err}"]
        if not task.eval_splits:
            problems.append(f"--glue-task {task.name} has no labelled split to finetune on; its test set is predicted by "
                            f"the MNLI model (--glue-task mnli --predict-test).")
        return problems

    def dev_set_cost(self) -> str | None:
        try:
            return get_glue_dataset(self.glue_task).dev_set_cost
        except ConfigError:  # a value problem: problems() names it
            return None

    def data_problems(self) -> list[str]:
        """--data, then the dataset's files in it (and the test files --predict-test asks for)."""
        problems = super().data_problems()
        try:
            dataset = get_glue_dataset(self.glue_task)
        except ConfigError:  # a value problem: problems() names it
            return problems
        if problems or not dataset.eval_splits or self.data_path is None:
            return problems
        for split in ("train", *dataset.eval_splits):
            try:
                glue_split_path(dataset, split, self.data_path)
            except DataError as err:
                problems.append(f"--data: {err}")
        if self.predict_test:
            for split in dataset.test_splits:
                try:
                    glue_split_path(dataset, split, self.data_path)
                except DataError:
                    problems.append(f"--predict-test: no {dataset.files[split]} in {self.data_path} (nor in "
                                    f"{self.data_path / dataset.name}); add the test file there, or drop --predict-test.")
        return problems
