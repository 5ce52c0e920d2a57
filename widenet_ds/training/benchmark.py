"""The finetuning benchmarks as small entries over the one loop: data, head, metric, files.

`Benchmark` names what finetuning (training/finetuning.py) uses of a GLUE dataset or of SQuAD; `GlueBenchmark` and
`SquadBenchmark` implement it, each with its own settings (`GlueConfig`, `SquadConfig` in run_config.py: the flags
only that benchmark has). Benchmarks print nothing: what they have to say comes back as lines that the run logs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch.distributed as torch_dist

from widenet_ds.errors import DataError
from widenet_ds.model.widenet import WideNetForQuestionAnswering, WideNetForSequenceClassification
from widenet_ds.benchmarks.features import glue_features
from widenet_ds.benchmarks.glue import GLUE_DATASETS, get_glue_dataset, glue_split_path, load_glue_split, write_glue_predictions
from widenet_ds.benchmarks.glue_metrics import glue_metrics
from widenet_ds.benchmarks.recipes import FinetuneRecipe, recipe_for
from widenet_ds.benchmarks.squad import load_squad, squad_json_from_examples
from widenet_ds.benchmarks.squad_features import SquadFeatureConfig, build_squad_features
from widenet_ds.benchmarks.squad_metrics import evaluate_v1, evaluate_v2
from widenet_ds.benchmarks.squad_postprocess import decode_squad, tune_null_threshold, write_squad_outputs
from widenet_ds.training.run_config import FinetuneConfig, GlueConfig, SquadConfig
from widenet_ds.training.predict import Batching, Prepared, predict


class Benchmark(Protocol):
    """What finetuning uses of a benchmark; built once per run from the validated `GlueConfig` / `SquadConfig`."""

    name: str  # e.g. "SST-2", "SQuAD1.1": names the recipe and the output files
    primary_metric: str
    model_class: type  # the task model (its head)

    def __init__(self, cfg: FinetuneConfig) -> None: ...

    def recipe(self) -> FinetuneRecipe: ...

    def model_kwargs(self) -> dict[str, Any]:
        """The task model's own constructor arguments (the number of labels)."""

    def prepare(self, tokenizer, max_len: int) -> Prepared:
        """Training and evaluation features (read once per run, shared by the seeds)."""

    def evaluate(self, engine, split: str, features, batching: Batching, out_dir: Path) -> dict[str, float]:
        """Collective: score `split`, write its prediction files to `out_dir` (rank 0), return the metrics."""

    def predict_test(self, engine, tokenizer, max_len: int, batching: Batching, out_dir: Path) -> list[str]:
        """Collective: the test-set files the options ask for; one line per file written."""

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """A trivial predictor's metrics per evaluation split, to read the model's against."""


def _is_main() -> bool:
    return torch_dist.get_rank() == 0


def _glue_predictions(dataset, engine, features, batching: Batching) -> np.ndarray:
    """Class indices (argmax), or scores for regression, in dataset order."""
    logits = np.stack(predict(engine, features, batching, ("logits",))["logits"])
    return logits[:, 0] if dataset.is_regression else logits.argmax(axis=1)


class GlueBenchmark:
    """A GLUE task: sequence classification (regression for STS-B), dev metrics, submission files."""

    model_class = WideNetForSequenceClassification

    def __init__(self, cfg: GlueConfig) -> None:
        self.cfg = cfg
        self.dataset = get_glue_dataset(cfg.glue_task)
        self.name = self.dataset.name
        self.primary_metric = self.dataset.primary_metric

    def recipe(self) -> FinetuneRecipe:
        return recipe_for(self.name)

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": self.dataset.num_labels}

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
        preds = _glue_predictions(self.dataset, engine, features, batching)
        if _is_main():
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
            preds = _glue_predictions(dataset, engine, features, batching)
            if _is_main():
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


class SquadBenchmark:
    """SQuAD v1.1 / v2.0: span start/end head, n-best decoding, null threshold tuned on dev (v2.0)."""

    primary_metric = "f1"
    model_class = WideNetForQuestionAnswering

    def __init__(self, cfg: SquadConfig) -> None:
        self.cfg = cfg
        self.version = cfg.version
        self.name = f"SQuAD{self.version}"

    def recipe(self) -> FinetuneRecipe:
        return recipe_for(self.name)

    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def prepare(self, tokenizer, max_len: int) -> Prepared:
        cfg = self.cfg
        # Without flags: BERT's 128-token stride and 64-token questions, shrunk for short max lengths.
        stride = cfg.doc_stride if cfg.doc_stride is not None else min(128, max_len // 4)
        feature_cfg = SquadFeatureConfig(max_seq_length=max_len, doc_stride=stride,
                                         max_query_length=min(64, max_len // 4))
        train_file, dev_file = cfg.file("train"), cfg.file("dev")
        train_examples = load_squad(self.version, "train", train_file).examples
        dev_examples = load_squad(self.version, "dev", dev_file).examples
        if cfg.max_train_examples:
            train_examples = train_examples[: cfg.max_train_examples]
        if cfg.max_eval_examples:
            dev_examples = dev_examples[: cfg.max_eval_examples]
        train = build_squad_features(train_examples, tokenizer, feature_cfg, training=True)
        dev = build_squad_features(dev_examples, tokenizer, feature_cfg, training=False)
        self.dev_examples = dev_examples
        self.dev_json = squad_json_from_examples(dev_examples, self.version)["data"]
        notes = [f"train {train_file or 'hf'}: {len(train_examples)} questions; dev {dev_file or 'hf'}: "
                 f"{len(dev_examples)}; windows of {max_len} tokens, doc_stride {stride}",
                 f"train: {train.summary()}", f"dev: {dev.summary()}"]
        if train_file is not None and dev_file is not None and train_file.resolve() == dev_file.resolve():
            notes.append(f"note: the dev scores are on {dev_file}, the file the model trains on: they measure how "
                         f"well it fits questions it has seen, not held-out ones (--dev-file names another file)")
        return Prepared(train, {"dev": dev}, notes)

    def evaluate(self, engine, split: str, features, batching: Batching, out_dir: Path) -> dict[str, float]:
        logits = predict(engine, features, batching, ("start_logits", "end_logits"))
        decoded = decode_squad(self.dev_examples, features, logits["start_logits"], logits["end_logits"])
        if self.version == "1.1":
            predictions = decoded.predictions("1.1")
            metrics = evaluate_v1(self.dev_json, predictions)
        else:
            threshold, _ = tune_null_threshold(self.dev_json, decoded)
            predictions = decoded.predictions("2.0", threshold)
            metrics = evaluate_v2(self.dev_json, predictions, na_probs=decoded.null_odds)
            metrics["null_threshold"] = threshold
        if _is_main():
            write_squad_outputs(out_dir, predictions, decoded.null_odds if self.version == "2.0" else None,
                                decoded.nbest)
        return metrics

    def predict_test(self, engine, tokenizer, max_len: int, batching: Batching, out_dir: Path) -> list[str]:
        """SQuAD has no public test set (its submissions are dev-format predictions.json): nothing to write."""
        return []

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """The empty answer for every question."""
        empty = {ex.qid: "" for ex in self.dev_examples}
        return {"dev": evaluate_v1(self.dev_json, empty) if self.version == "1.1" else evaluate_v2(self.dev_json, empty)}
