"""What finetuning (tasks/finetune/task.py) uses of what it finetunes on: the data, the head, the metric, the files
it writes. Each finetuning task implements it in its package (`GlueFinetuning`, `SquadFinetuning`), with its own
settings (`GlueConfig`, `SquadConfig`: the flags only it has); the loop is shared and never asks its name. It
prints nothing: what it has to say comes back as lines that the run logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from widenet_ds.tasks.finetune.config import FinetuneConfig
from widenet_ds.tasks.finetune.predict import Batching, Prepared
from widenet_ds.tasks.finetune.recipe import FinetuneRecipe


class Finetuning(Protocol):
    """What a finetuning run trains on and how it scores; built once per run from the validated settings."""

    name: str  # e.g. "SST-2", "SQuAD1.1": names the recipe and the output files, and results.json's "task"
    primary_metric: str
    model_class: type  # the task model (its head)

    def __init__(self, cfg: FinetuneConfig) -> None: ...

    def recipe(self) -> FinetuneRecipe: ...

    def model_kwargs(self) -> dict[str, Any]:
        """The task model's own constructor arguments (the number of labels)."""

    def label_names(self) -> tuple[str, ...]:
        """What each of the classifier's labels means, in their order (the saved model's, and its HF export's
        id2label); () when the head has no named labels (a regression, spans)."""

    def prepare(self, tokenizer, max_len: int) -> Prepared:
        """Training and evaluation features (read once per run, shared by the seeds)."""

    def evaluate(self, engine, split: str, features, batching: Batching, out_dir: Path) -> dict[str, float]:
        """Collective: score `split`, write its prediction files to `out_dir` (rank 0), return the metrics."""

    def predict_test(self, engine, tokenizer, max_len: int, batching: Batching, out_dir: Path) -> list[str]:
        """Collective: the test-set files the options ask for; one line per file written."""

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """A trivial predictor's metrics per evaluation split, to read the model's against."""
