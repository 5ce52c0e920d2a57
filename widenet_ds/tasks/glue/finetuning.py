"""Finetuning on a GLUE dataset: sequence classification (regression for STS-B), the dev metrics, the submission
files of the test sets."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as torch_dist

from widenet_ds.errors import DataError
from widenet_ds.model.widenet import WideNetForSequenceClassification
from widenet_ds.tasks.finetune.features import glue_features
from widenet_ds.tasks.finetune.predict import Batching, Prepared, predict
from widenet_ds.tasks.finetune.recipe import FinetuneRecipe
from widenet_ds.tasks.glue.config import GlueConfig
from widenet_ds.tasks.glue.datasets import (
    GLUE_DATASETS,
    GlueDataset,
    get_glue_dataset,
    glue_split_path,
    load_glue_split,
    write_glue_predictions,
)
from widenet_ds.tasks.glue.metrics import glue_metrics
from widenet_ds.tasks.glue.recipes import GLUE_RECIPES


def glue_predictions(dataset: GlueDataset, engine, features, batching: Batching) -> np.ndarray:
    """Class indices (argmax), or scores for regression, in dataset order (collective)."""
    logits = np.stack(predict(engine, features, batching, ("logits",))["logits"])
    return logits[:, 0] if dataset.is_regression else logits.argmax(axis=1)


class GlueFinetuning:
    """A GLUE dataset: sequence classification (regression for STS-B), dev metrics, submission files."""

    model_class = WideNetForSequenceClassification

    def __init__(self, cfg: GlueConfig) -> None:
        self.cfg = cfg
        self.dataset = get_glue_dataset(cfg.glue_task)
        self.name = self.dataset.name
        self.primary_metric = self.dataset.primary_metric

    def recipe(self) -> FinetuneRecipe:
        return GLUE_RECIPES[self.name]

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": self.dataset.num_labels}

    def label_names(self) -> tuple[str, ...]:
        return self.dataset.label_names

    def prepare(self, tokenizer, max_len: int) -> Prepared:
        cfg = self.cfg
        train_split = load_glue_split(self.dataset, "train", cfg.data_path)
        notes = []
        if cfg.max_train_examples:
            train_split.examples = train_split.examples[: cfg.max_train_examples]
            notes.append(f"--max-train-examples: training on the first {len(train_split.examples)} examples")
        train = glue_features(train_split, tokenizer, max_len)
        evals = {}
        for split in self.dataset.eval_splits:
            eval_split = load_glue_split(self.dataset, split, cfg.data_path)
            if cfg.max_eval_examples:
                eval_split.examples = eval_split.examples[: cfg.max_eval_examples]
            evals[split] = glue_features(eval_split, tokenizer, max_len)
        notes += [features.summary_text for features in (train, *evals.values())]
        return Prepared(train, evals, notes)

    def evaluate(self, engine, split: str, features, batching: Batching, out_dir: Path) -> dict[str, float]:
        preds = glue_predictions(self.dataset, engine, features, batching)
        if torch_dist.get_rank() == 0:
            write_glue_predictions(self.dataset, split, features.guids, preds.tolist(), out_dir)
        return glue_metrics(self.dataset, preds, features.labels)

    def predict_test(self, engine, tokenizer, max_len: int, batching: Batching, out_dir: Path) -> list[str]:
        """With --predict-test: test-set files in the GLUE submission format (MNLI: MNLI-m.tsv, MNLI-mm.tsv,
        and AX.tsv when the diagnostic set is found next to the MNLI folder)."""
        if not self.cfg.predict_test:
            return []
        data_path = self.cfg.data_path
        jobs = [(self.dataset, split, data_path) for split in self.dataset.test_splits]
        lines = []
        if self.name == "MNLI" and data_path is not None:
            for folder in (data_path, data_path.parent, data_path.parent / "diagnostic"):
                try:
                    glue_split_path(GLUE_DATASETS["AX"], "test", folder)
                except DataError:
                    continue
                jobs.append((GLUE_DATASETS["AX"], "test", folder))
                break
            else:
                lines.append(f"no AX.tsv near {data_path}: the diagnostic set is not predicted")
        for dataset, split, source in jobs:
            features = glue_features(load_glue_split(dataset, split, source), tokenizer, max_len)
            preds = glue_predictions(dataset, engine, features, batching)
            if torch_dist.get_rank() == 0:
                path = write_glue_predictions(dataset, split, features.guids, preds.tolist(), out_dir)
                lines.append(f"{len(preds)} test predictions -> {path}")
        return lines

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """Majority class of the training labels (mean score for regression), scored on each eval split."""
        if self.dataset.is_regression:
            guess = float(np.mean(data.train.labels))
        else:
            guess = Counter(data.train.labels.tolist()).most_common(1)[0][0]
        return {split: glue_metrics(self.dataset, np.full(len(f.labels), guess, dtype=f.labels.dtype), f.labels)
                if not self.dataset.is_regression else {"note": "constant prediction has no correlation"}
                for split, f in data.evals.items()}
