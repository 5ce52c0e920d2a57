"""Finetuning on your own labelled texts: GLUE's sequence classification head (one output: regression), its features,
predictions and files over the dataset your data is (data.py), scored with accuracy and macro-F1, or Pearson and
Spearman."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as torch_dist

from widenet_ds.model.widenet import WideNetForSequenceClassification
from widenet_ds.tasks.finetune.features import glue_features
from widenet_ds.tasks.finetune.predict import Batching, Prepared
from widenet_ds.tasks.finetune.recipe import FinetuneRecipe
from widenet_ds.tasks.glue.datasets import GlueDataset, write_glue_predictions
from widenet_ds.tasks.glue.finetuning import glue_predictions
from widenet_ds.tasks.glue.recipes import GLUE_RECIPES
from widenet_ds.tasks.text_classification.config import TextClassificationConfig
from widenet_ds.tasks.text_classification.data import Columns, labelled_splits, read_file, read_hf_dataset
from widenet_ds.tasks.text_classification.metrics import text_metrics

# The WideNet paper's recipe for a sentence classification (Table 7, SST-2's), the default on data of your own; its
# model settings change with --set, its optimisation lives in the DeepSpeed JSON (ds_configs/finetune_sst2.json).
RECIPE = dataclasses.replace(GLUE_RECIPES["SST-2"], source="widenet-table7 (SST-2's, for your own labelled texts)")


class TextClassificationFinetuning:
    """Your labelled texts: classes (or scores) of a text or a pair of texts, read once per run; the classes are
    known once the training file is read (`prepare`)."""

    model_class = WideNetForSequenceClassification

    def __init__(self, cfg: TextClassificationConfig) -> None:
        self.cfg = cfg
        self.name = cfg.data_name
        self.primary_metric = "pearson" if cfg.regression else "acc"
        self.columns = Columns(cfg.text_fields, cfg.label_field, cfg.regression)
        self.dataset: GlueDataset | None = None

    def recipe(self) -> FinetuneRecipe:
        return RECIPE

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": self.dataset.num_labels}

    def label_names(self) -> tuple[str, ...]:
        return self.dataset.label_names

    def prepare(self, tokenizer, max_len: int) -> Prepared:
        cfg = self.cfg
        records = read_hf_dataset(cfg.dataset) if cfg.dataset is not None else \
            {split: read_file(cfg.split_file(split)) for split in ("train", "validation")}
        self.dataset, splits = labelled_splits(records, self.columns, self.name)
        train, validation = splits["train"], splits["validation"]
        notes = [f"{self.name}: " + (f"scores in {cfg.label_field!r} (--regression)" if cfg.regression else
                                     f"{self.dataset.num_labels} classes in {cfg.label_field!r}: "
                                     f"{', '.join(self.dataset.label_names)}")]
        if cfg.max_train_examples:
            train.examples = train.examples[: cfg.max_train_examples]
            notes.append(f"--max-train-examples: training on the first {len(train.examples)} examples")
        if cfg.max_eval_examples:
            validation.examples = validation.examples[: cfg.max_eval_examples]
        features = {split: glue_features(splits[split], tokenizer, max_len) for split in splits}
        notes += [f.summary_text for f in features.values()]
        return Prepared(features["train"], {"validation": features["validation"]}, notes)

    def evaluate(self, engine, split: str, features, batching: Batching, out_dir: Path) -> dict[str, float]:
        """The metrics; `<name>.<split>.tsv` holds each example's predicted class (its name) or score."""
        preds = glue_predictions(self.dataset, engine, features, batching)
        if torch_dist.get_rank() == 0:
            write_glue_predictions(self.dataset, split, features.guids, preds.tolist(), out_dir)
        return text_metrics(self.dataset, preds, features.labels)

    def predict_test(self, engine, tokenizer, max_len: int, batching: Batching, out_dir: Path) -> list[str]:
        return []

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """The training labels' majority class, scored on each evaluation split (a constant score has no
        correlation)."""
        if self.dataset.is_regression:
            return {split: {"note": "constant prediction has no correlation"} for split in data.evals}
        guess = Counter(data.train.labels.tolist()).most_common(1)[0][0]
        return {split: text_metrics(self.dataset, np.full(len(f.labels), guess, dtype=f.labels.dtype), f.labels)
                for split, f in data.evals.items()}
