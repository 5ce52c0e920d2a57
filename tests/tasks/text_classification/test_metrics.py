"""Macro-F1 against scikit-learn on random predictions (the classes that occur in the labels or the predictions,
a rare one counting as much as a frequent one); the scores of a classification and of a regression."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from widenet_ds.tasks.glue.datasets import GLUE_DATASETS, GlueDataset, Layout
from widenet_ds.tasks.text_classification.metrics import macro_f1, text_metrics


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    n, classes = int(rng.integers(20, 300)), int(rng.integers(2, 6))
    labels = rng.choice(classes, n, p=np.r_[0.7, np.full(classes - 1, 0.3 / (classes - 1))])  # skewed
    preds = np.where(rng.random(n) < 0.6, labels, rng.integers(0, classes + 1, n))  # now and then a class of none
    assert macro_f1(preds, labels) == pytest.approx(skm.f1_score(labels, preds, average="macro"), abs=1e-12)


def test_classes_get_accuracy_and_macro_f1_scores_pearson_and_spearman():
    classes = GlueDataset("mine", {}, Layout(True, text_a="text", label="label"), Layout(True, text_a="text"),
                          labels=("a", "b", "c"), label_names=("a", "b", "c"), metrics=("acc", "macro_f1"),
                          primary_metric="acc")
    scores = text_metrics(classes, np.array([0, 0, 0, 1]), np.array([0, 0, 2, 1]))
    assert scores == {"acc": 0.75, "macro_f1": pytest.approx((0.8 + 1.0 + 0.0) / 3)}
    regression = text_metrics(GLUE_DATASETS["STS-B"], np.array([0.1, 0.4, 0.35, 0.8]), np.array([0.0, 0.5, 0.2, 1.0]))
    assert set(regression) == {"pearson", "spearmanr", "corr"} and regression["spearmanr"] == pytest.approx(1.0)
