"""The finetuning tasks as small entries over the one loop in `finetune.py`: data, head, metric, files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as torch_dist

from widenet_ds.finetune import Prepared, build_model, predict
from widenet_ds.model import WideNetForQuestionAnswering, WideNetForSequenceClassification


def _is_main() -> bool:
    return torch_dist.get_rank() == 0


class GlueTaskRun:
    label_keys = ("labels",)

    def __init__(self, args) -> None:
        from widenet_ds.tasks.glue import get_glue_task
        self.task = get_glue_task(args.task)
        self.name = self.task.name

    def recipe(self, args):
        from widenet_ds.tasks.recipes import recipe_for
        return recipe_for(self.name)

    def model(self, args, recipe, vocab_size: int):
        return build_model(args, WideNetForSequenceClassification, recipe, vocab_size, num_labels=self.task.num_labels)

    def _split(self, args, split: str):
        from widenet_ds.tasks.glue import load_glue_split
        return load_glue_split(self.task, split, None if args.data == "hf" else args.data)

    def prepare(self, args, tokenizer, max_len: int) -> Prepared:
        from widenet_ds.tasks.features import glue_features
        train_split = self._split(args, "train")
        if args.max_train_examples:
            train_split.examples = train_split.examples[: args.max_train_examples]
            if _is_main():
                print(f"[data] --max-train-examples: training on the first {len(train_split.examples)} examples",
                      flush=True)
        train = glue_features(train_split, tokenizer, max_len)
        evals = {}
        for split in self.task.eval_splits:
            eval_split = self._split(args, split)
            if args.max_eval_examples:
                eval_split.examples = eval_split.examples[: args.max_eval_examples]
            evals[split] = glue_features(eval_split, tokenizer, max_len)
        if _is_main():
            for features in (train, *evals.values()):
                print(f"[data] {features.summary_text}", flush=True)
        self.train_labels = train.labels
        return Prepared(train, evals)

    def evaluate(self, engine, split: str, features, micro: int, out_dir: Path) -> dict[str, float]:
        from widenet_ds.tasks.glue import write_glue_predictions
        from widenet_ds.tasks.glue_metrics import glue_metrics
        logits = np.stack(predict(engine, features, micro, ("logits",))["logits"])
        preds = logits[:, 0] if self.task.is_regression else logits.argmax(axis=1)
        if _is_main():
            write_glue_predictions(self.task, split, features.guids, preds.tolist(), out_dir)
        return glue_metrics(self.task, preds, features.labels)

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """Majority class of the training labels (mean score for regression), scored on each eval split."""
        from widenet_ds.tasks.glue_metrics import glue_metrics
        if self.task.is_regression:
            guess = float(np.mean(data.train.labels))
        else:
            guess = Counter(data.train.labels.tolist()).most_common(1)[0][0]
        return {split: glue_metrics(self.task, np.full(len(f.labels), guess, dtype=f.labels.dtype), f.labels)
                if not self.task.is_regression else {"note": "constant prediction has no correlation"}
                for split, f in data.evals.items()}


class SquadTaskRun:
    label_keys = ("start_positions", "end_positions")

    def __init__(self, args) -> None:
        self.version = args.version
        self.name = f"SQuAD{args.version}"

    def recipe(self, args):
        from widenet_ds.tasks.recipes import recipe_for
        return recipe_for(self.name)

    def model(self, args, recipe, vocab_size: int):
        return build_model(args, WideNetForQuestionAnswering, recipe, vocab_size)

    def prepare(self, args, tokenizer, max_len: int) -> Prepared:
        from widenet_ds.tasks.squad import load_squad, squad_json_from_examples
        from widenet_ds.tasks.squad_features import SquadFeatureConfig, build_squad_features
        feature_cfg = SquadFeatureConfig(max_seq_length=max_len, doc_stride=min(args.doc_stride, max_len // 4),
                                         max_query_length=min(64, max_len // 4))
        path = None if args.data == "hf" else Path(args.data)
        train_file = args.train_file or (path and (path if path.is_file() else path / f"train-v{self.version}.json"))
        dev_file = args.dev_file or (path and (path if path.is_file() else path / f"dev-v{self.version}.json"))
        train_examples = load_squad(self.version, "train", train_file).examples
        dev_examples = load_squad(self.version, "dev", dev_file).examples
        if args.max_train_examples:
            train_examples = train_examples[: args.max_train_examples]
        if args.max_eval_examples:
            dev_examples = dev_examples[: args.max_eval_examples]
        train = build_squad_features(train_examples, tokenizer, feature_cfg, training=True)
        dev = build_squad_features(dev_examples, tokenizer, feature_cfg, training=False)
        if _is_main():
            print(f"[data] train: {train.summary()}\n[data] dev: {dev.summary()}", flush=True)
        self.dev_examples = dev_examples
        self.dev_json = squad_json_from_examples(dev_examples, self.version)["data"]
        return Prepared(train, {"dev": dev})

    def evaluate(self, engine, split: str, features, micro: int, out_dir: Path) -> dict[str, float]:
        from widenet_ds.tasks.squad_metrics import evaluate_v1, evaluate_v2
        from widenet_ds.tasks.squad_postprocess import decode_squad, tune_null_threshold, write_squad_outputs
        logits = predict(engine, features, micro, ("start_logits", "end_logits"))
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
            write_squad_outputs(out_dir, predictions, decoded.null_odds if self.version == "2.0" else None)
        return metrics

    def baseline(self, data: Prepared) -> dict[str, Any]:
        """The empty answer for every question."""
        from widenet_ds.tasks.squad_metrics import evaluate_v1, evaluate_v2
        empty = {ex.qid: "" for ex in self.dev_examples}
        return {"dev": evaluate_v1(self.dev_json, empty) if self.version == "1.1" else evaluate_v2(self.dev_json, empty)}
