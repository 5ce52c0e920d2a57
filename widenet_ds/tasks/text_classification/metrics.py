"""The scores of your own labelled texts: GLUE's metrics of the dataset they are (accuracy; Pearson and Spearman for
scores) and, for classes, macro-F1: the mean over the classes of each class's F1 against the rest, so a rare class
counts as much as a frequent one (scikit-learn's `f1_score(average="macro")`: over the classes that occur in the
labels or the predictions)."""

from __future__ import annotations

import numpy as np

from widenet_ds.tasks.glue.datasets import GlueDataset
from widenet_ds.tasks.glue.metrics import f1_binary, glue_metrics


def macro_f1(preds, labels) -> float:
    classes = np.union1d(np.asarray(labels), np.asarray(preds))
    return float(np.mean([f1_binary(preds, labels, positive=c) for c in classes]))


def text_metrics(dataset: GlueDataset, preds, labels) -> dict[str, float]:
    """`dataset`'s metrics of class indices (argmax) or scores."""
    metrics = glue_metrics(dataset, preds, labels)
    if not dataset.is_regression:
        metrics["macro_f1"] = macro_f1(preds, labels)
    return metrics
