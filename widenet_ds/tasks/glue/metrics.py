"""GLUE metrics in numpy (the runtime does not depend on scikit-learn/scipy; tests compare with them)
and `widenet-ds glue-eval`.

Per task, as the GLUE paper and leaderboard: CoLA Matthews correlation; MRPC and QQP accuracy and F1
of the positive class (and their mean); STS-B Pearson and Spearman (and their mean); accuracy else.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from widenet_ds.errors import DataError
from widenet_ds.tasks.glue.datasets import (
    GLUE_DATASETS,
    GlueDataset,
    get_glue_dataset,
    read_glue_predictions,
    read_glue_tsv,
)


def accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(preds) == np.asarray(labels)))


def f1_binary(preds: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    preds, labels = np.asarray(preds) == positive, np.asarray(labels) == positive
    tp = int(np.sum(preds & labels))
    denom = int(np.sum(preds)) + int(np.sum(labels))
    return 0.0 if denom == 0 else 2.0 * tp / denom


def matthews_corrcoef(preds: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin 2004), 0 when either side is constant, as sklearn."""
    classes, encoded = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    y_true, y_pred = encoded[: len(labels)], encoded[len(labels):]
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (y_true, y_pred), 1)
    t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    cov_tp = correct * n - t_sum @ p_sum
    cov_pp = n * n - p_sum @ p_sum
    cov_tt = n * n - t_sum @ t_sum
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    y = np.asarray(y, dtype=np.float64) - np.mean(y)
    denom = np.sqrt((x @ x) * (y @ y))
    return float("nan") if denom == 0 else float(np.clip((x @ y) / denom, -1.0, 1.0))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of their ranks (scipy.stats.rankdata 'average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x), dtype=np.float64)
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2.0  # mean of start+1 .. end
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(_average_ranks(x), _average_ranks(y))


def glue_metrics(task: GlueDataset | str, preds, labels) -> dict[str, float]:
    """The task's metrics; `preds` are class indices (argmax) or regression scores."""
    task = get_glue_dataset(task) if isinstance(task, str) else task
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape or preds.ndim != 1:
        raise ValueError(f"predictions {preds.shape} and labels {labels.shape} must be equal-length vectors")
    if len(labels) == 0:
        raise DataError(f"{task.name}: no labelled examples to score")
    out: dict[str, float] = {}
    if task.is_regression:
        out["pearson"] = pearson(preds, labels)
        out["spearmanr"] = spearman(preds, labels)
        out["corr"] = (out["pearson"] + out["spearmanr"]) / 2
    elif "mcc" in task.metrics:
        out["mcc"] = matthews_corrcoef(preds, labels)
    else:
        out["acc"] = accuracy(preds, labels)
        if "f1" in task.metrics:
            out["f1"] = f1_binary(preds, labels)
            out["acc_and_f1"] = (out["acc"] + out["f1"]) / 2
    return out


def evaluate_glue_files(task: GlueDataset | str, data_path: str, predictions_path: str) -> dict[str, float | int | str]:
    """Score a predictions file (`index<TAB>prediction`, as written for the GLUE server) on a labelled TSV."""
    task = get_glue_dataset(task) if isinstance(task, str) else task
    split = read_glue_tsv(task, data_path, labelled=True)
    preds = read_glue_predictions(task, predictions_path)
    guids = [ex.guid for ex in split.examples]
    missing = [g for g in guids if g not in preds]
    extra = sorted(set(preds) - set(guids))
    if missing or extra:
        raise DataError(f"{predictions_path} does not match {data_path}: {len(missing)} indices without a prediction "
                        f"(e.g. {missing[:3]}), {len(extra)} predictions for unknown indices (e.g. {extra[:3]})")
    metrics = glue_metrics(task, [preds[g] for g in guids], [ex.label for ex in split.examples])
    skipped = sum(split.skipped.values())
    if skipped:
        print(split.summary(), file=sys.stderr)
    return {"task": task.name, "total": len(guids), "skipped": skipped, **metrics}


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="widenet-ds glue-eval", description="GLUE metrics of a predictions file.")
    parser.add_argument("--glue-task", "--task", dest="task", required=True,
                        help=f"{', '.join(d.name for d in GLUE_DATASETS.values() if d.eval_splits)} (--task is the "
                             "same flag)")
    parser.add_argument("--data", required=True, help="labelled GLUE TSV (e.g. dev.tsv, dev_mismatched.tsv)")
    parser.add_argument("--predictions", required=True, help="TSV with header 'index<TAB>prediction'")
    args = parser.parse_args(argv)
    print(json.dumps(evaluate_glue_files(args.task, args.data, args.predictions), indent=2))
    return 0
