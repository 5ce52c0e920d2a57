"""The finetuning tasks as small entries over the one loop in `finetune.py`: data, head, metric, files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as torch_dist

from widenet_ds.errors import ConfigError, DataError
from widenet_ds.model.widenet import WideNetForQuestionAnswering, WideNetForSequenceClassification
from widenet_ds.tasks.features import glue_features
from widenet_ds.tasks.glue import GLUE_TASKS, get_glue_task, glue_split_path, load_glue_split, write_glue_predictions
from widenet_ds.tasks.glue_metrics import glue_metrics
from widenet_ds.tasks.recipes import recipe_for
from widenet_ds.tasks.squad import load_squad, squad_json_from_examples
from widenet_ds.tasks.squad_features import SquadFeatureConfig, build_squad_features
from widenet_ds.tasks.squad_metrics import evaluate_v1, evaluate_v2
from widenet_ds.tasks.squad_postprocess import decode_squad, tune_null_threshold, write_squad_outputs
from widenet_ds.training.finetune_config import FinetuneConfig
from widenet_ds.training.finetune_weights import build_model
from widenet_ds.training.predict import Batching, Prepared, predict


def _is_main() -> bool:
    return torch_dist.get_rank() == 0


def _glue_predictions(task, engine, features, batching: Batching) -> np.ndarray:
    """Class indices (argmax), or scores for regression, in dataset order."""
    logits = np.stack(predict(engine, features, batching, ("logits",))["logits"])
    return logits[:, 0] if task.is_regression else logits.argmax(axis=1)


class GlueTaskRun:
    """A GLUE task: sequence classification (regression for STS-B), dev metrics, submission files."""

    def __init__(self, cfg: FinetuneConfig) -> None:
        self.task = get_glue_task(cfg.task)
        if not self.task.eval_splits:
            raise ConfigError(f"{self.task.name} has no labelled split to finetune on; its test set is predicted by "
                              f"the MNLI model (--task mnli --predict-test).")
        self.name = self.task.name
        self.primary_metric = self.task.primary_metric

    def recipe(self):
        return recipe_for(self.name)

    def model(self, cfg: FinetuneConfig, recipe, vocab_size: int):
        return build_model(cfg, WideNetForSequenceClassification, recipe, vocab_size, num_labels=self.task.num_labels)

    def prepare(self, cfg: FinetuneConfig, tokenizer, max_len: int) -> Prepared:
        train_split = load_glue_split(self.task, "train", cfg.data_path)
        if cfg.max_train_examples:
            train_split.examples = train_split.examples[: cfg.max_train_examples]
            if _is_main():
                print(f"[data] --max-train-examples: training on the first {len(train_split.examples)} examples",
                      flush=True)
        train = glue_features(train_split, tokenizer, max_len)
        evals = {}
        for split in self.task.eval_splits:
            eval_split = load_glue_split(self.task, split, cfg.data_path)
            if cfg.max_eval_examples:
                eval_split.examples = eval_split.examples[: cfg.max_eval_examples]
            evals[split] = glue_features(eval_split, tokenizer, max_len)
        if _is_main():
            for features in (train, *evals.values()):
                print(f"[data] {features.summary_text}", flush=True)
        return Prepared(train, evals)

    def evaluate(self, engine, split: str, features, batching: Batching, out_dir: Path) -> dict[str, float]:
        preds = _glue_predictions(self.task, engine, features, batching)
        if _is_main():
            write_glue_predictions(self.task, split, features.guids, preds.tolist(), out_dir)
        return glue_metrics(self.task, preds, features.labels)

    def predict_test(self, cfg: FinetuneConfig, engine, tokenizer, max_len: int, batching: Batching, out_dir: Path) -> None:
        """Test-set files in the GLUE submission format (MNLI: MNLI-m.tsv, MNLI-mm.tsv, and AX.tsv when the
        diagnostic set is found next to the MNLI folder)."""
        jobs = [(self.task, split, cfg.data_path) for split in self.task.test_splits]
        if self.name == "MNLI" and cfg.data_path is not None:
            for folder in (cfg.data_path, cfg.data_path.parent, cfg.data_path.parent / "diagnostic"):
                try:
                    glue_split_path(GLUE_TASKS["AX"], "test", folder)
                except DataError:
                    continue
                jobs.append((GLUE_TASKS["AX"], "test", folder))
                break
            else:
                if _is_main():
                    print(f"[finetune] no AX.tsv near {cfg.data_path}: the diagnostic set is not predicted", flush=True)
        for task, split, source in jobs:
            features = glue_features(load_glue_split(task, split, source), tokenizer, max_len)
            preds = _glue_predictions(task, engine, features, batching)
            if _is_main():
                path = write_glue_predictions(task, split, features.guids, preds.tolist(), out_dir)
                print(f"[finetune] {len(preds)} test predictions -> {path}", flush=True)

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """Majority class of the training labels (mean score for regression), scored on each eval split."""
        if self.task.is_regression:
            guess = float(np.mean(data.train.labels))
        else:
            guess = Counter(data.train.labels.tolist()).most_common(1)[0][0]
        return {split: glue_metrics(self.task, np.full(len(f.labels), guess, dtype=f.labels.dtype), f.labels)
                if not self.task.is_regression else {"note": "constant prediction has no correlation"}
                for split, f in data.evals.items()}


class SquadTaskRun:
    """SQuAD v1.1 / v2.0: span start/end head, n-best decoding, null threshold tuned on dev (v2.0)."""

    primary_metric = "f1"

    def __init__(self, cfg: FinetuneConfig) -> None:
        self.version = cfg.version
        self.name = f"SQuAD{cfg.version}"

    def recipe(self):
        return recipe_for(self.name)

    def model(self, cfg: FinetuneConfig, recipe, vocab_size: int):
        return build_model(cfg, WideNetForQuestionAnswering, recipe, vocab_size)

    def prepare(self, cfg: FinetuneConfig, tokenizer, max_len: int) -> Prepared:
        # Without flags: BERT's 128-token stride and 64-token questions, shrunk for short max lengths.
        stride = cfg.doc_stride if cfg.doc_stride is not None else min(128, max_len // 4)
        feature_cfg = SquadFeatureConfig(max_seq_length=max_len, doc_stride=stride,
                                         max_query_length=min(64, max_len // 4))
        path = cfg.data_path
        train_file = cfg.train_file or (path and (path if path.is_file() else path / f"train-v{self.version}.json"))
        dev_file = cfg.dev_file or (path and (path if path.is_file() else path / f"dev-v{self.version}.json"))
        train_examples = load_squad(self.version, "train", train_file).examples
        dev_examples = load_squad(self.version, "dev", dev_file).examples
        if cfg.max_train_examples:
            train_examples = train_examples[: cfg.max_train_examples]
        if cfg.max_eval_examples:
            dev_examples = dev_examples[: cfg.max_eval_examples]
        if _is_main():
            print(f"[data] train {train_file or 'hf'}: {len(train_examples)} questions; dev {dev_file or 'hf'}: "
                  f"{len(dev_examples)}; windows of {max_len} tokens, doc_stride {stride}", flush=True)
        train = build_squad_features(train_examples, tokenizer, feature_cfg, training=True)
        dev = build_squad_features(dev_examples, tokenizer, feature_cfg, training=False)
        if _is_main():
            print(f"[data] train: {train.summary()}\n[data] dev: {dev.summary()}", flush=True)
        self.dev_examples = dev_examples
        self.dev_json = squad_json_from_examples(dev_examples, self.version)["data"]
        return Prepared(train, {"dev": dev})

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

    def write_test_predictions(self, engine, batching: Batching, out_dir: Path) -> None:
        """SQuAD has no public test set; predictions.json of dev is the submission format."""

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """The empty answer for every question."""
        empty = {ex.qid: "" for ex in self.dev_examples}
        return {"dev": evaluate_v1(self.dev_json, empty) if self.version == "1.1" else evaluate_v2(self.dev_json, empty)}
