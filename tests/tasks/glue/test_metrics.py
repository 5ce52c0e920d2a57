"""GLUE metrics against scikit-learn / scipy on random predictions, for every task."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from widenet_ds.tasks.glue.datasets import GLUE_DATASETS
from widenet_ds.tasks.glue.metrics import glue_metrics, matthews_corrcoef, spearman

LABELLED = [name for name, task in GLUE_DATASETS.items() if task.eval_splits]


def _reference(task, preds, labels) -> dict[str, float]:
    if task.is_regression:
        p, s = stats.pearsonr(preds, labels)[0], stats.spearmanr(preds, labels)[0]
        return {"pearson": p, "spearmanr": s, "corr": (p + s) / 2}
    if task.metrics == ("mcc",):
        return {"mcc": skm.matthews_corrcoef(labels, preds)}
    out = {"acc": skm.accuracy_score(labels, preds)}
    if "f1" in task.metrics:
        out["f1"] = skm.f1_score(labels, preds, pos_label=1)
        out["acc_and_f1"] = (out["acc"] + out["f1"]) / 2
    return out


@pytest.mark.parametrize("name", LABELLED)
@pytest.mark.parametrize("seed", range(5))
def test_metrics_match_sklearn_scipy(name, seed):
    task = GLUE_DATASETS[name]
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    if task.is_regression:
        labels = np.round(rng.uniform(0, 5, n) * 5) / 5  # STS-B style scores, many ties
        preds = np.where(rng.random(n) < 0.5, labels + rng.normal(0, 1, n), np.round(rng.uniform(0, 5, n)))
    else:
        labels = rng.integers(0, task.num_labels, n)
        # Skewed, partly correct predictions so that the metrics are away from 0.
        preds = np.where(rng.random(n) < rng.uniform(0.2, 0.9), labels, rng.integers(0, task.num_labels, n))
    ours = glue_metrics(task, preds, labels)
    ref = _reference(task, preds, labels)
    assert ours.keys() == ref.keys()
    for key in ref:
        assert ours[key] == pytest.approx(ref[key], abs=1e-12), key


def test_degenerate_inputs_follow_sklearn():
    labels = np.array([0, 1, 1, 0])
    constant = np.zeros(4, dtype=int)
    assert matthews_corrcoef(constant, labels) == skm.matthews_corrcoef(labels, constant) == 0.0
    three = np.array([0, 1, 2, 2, 1, 0, 2])
    assert matthews_corrcoef(three[::-1], three) == pytest.approx(skm.matthews_corrcoef(three, three[::-1]))
    # Spearman with ties everywhere: average ranks as scipy.
    x = np.array([1, 1, 2, 2, 2, 3.0])
    y = np.array([3, 1, 2, 2, 5, 1.0])
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
    # MRPC F1 without a single positive prediction or label is 0 (sklearn's zero_division=0).
    assert glue_metrics("MRPC", constant, constant)["f1"] == 0.0
