"""Finetuning on SQuAD v1.1 / v2.0: the span start/end head, n-best decoding, the null threshold tuned on dev
(v2.0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as torch_dist

from widenet_ds.model.widenet import WideNetForQuestionAnswering
from widenet_ds.tasks.finetune.predict import Batching, Prepared, predict
from widenet_ds.tasks.finetune.recipe import FinetuneRecipe
from widenet_ds.tasks.squad.config import SquadConfig
from widenet_ds.tasks.squad.data import load_squad, squad_json_from_examples
from widenet_ds.tasks.squad.features import SquadFeatureConfig, build_squad_features
from widenet_ds.tasks.squad.metrics import evaluate_v1, evaluate_v2
from widenet_ds.tasks.squad.postprocess import decode_squad, tune_null_threshold, write_squad_outputs
from widenet_ds.tasks.squad.recipes import SQUAD_RECIPES


class SquadFinetuning:
    """SQuAD v1.1 / v2.0: span start/end head, n-best decoding, null threshold tuned on dev (v2.0)."""

    primary_metric = "f1"
    model_class = WideNetForQuestionAnswering

    def __init__(self, cfg: SquadConfig) -> None:
        self.cfg = cfg
        self.version = cfg.version
        self.name = f"SQuAD{self.version}"

    def recipe(self) -> FinetuneRecipe:
        return SQUAD_RECIPES[self.version]

    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def label_names(self) -> tuple[str, ...]:
        return ()

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
        if torch_dist.get_rank() == 0:
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
