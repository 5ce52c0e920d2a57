"""The settings of finetuning on SQuAD v1.1 / v2.0: the version, its JSON files and the windows' stride."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from widenet_ds.tasks.finetune.config import TRAIN_FILE_HELP, FinetuneConfig
from widenet_ds.training.flags import flag

NOT_SCORES = ("total", "threshold", "thresh")  # the endings of the official script's entries that are no scores


@dataclass(kw_only=True)
class SquadConfig(FinetuneConfig):
    TASK: ClassVar[str] = "squad"
    DESCRIPTION: ClassVar[str] = "Finetuning on SQuAD v1.1 / v2.0 (predictions.json, null_odds.json for v2.0)."
    PATH_SETTINGS: ClassVar[frozenset[str]] = FinetuneConfig.PATH_SETTINGS | {"train_file", "dev_file"}

    version: Literal["1.1", "2.0"] = field(metadata=flag("SQuAD version"))
    train_file: str | None = field(default=None, metadata=flag(TRAIN_FILE_HELP))  # a SQuAD JSON
    dev_file: str | None = field(default=None, metadata=flag(
        "SQuAD JSON to evaluate on (default: --data/dev-v<version>.json, or --data itself when it is a file)"))
    doc_stride: int | None = field(default=None, metadata=flag(
        "tokens shared by consecutive windows (default: 128, at most a quarter of the max length)"))

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.doc_stride is not None and self.doc_stride < 0:
            problems.append(f"--doc-stride must be >= 0, got {self.doc_stride}.")
        return problems

    @classmethod
    def score_scale(cls, metric: str) -> str:
        """SQuAD's official scores are percentages, as its evaluation script prints them; its counts and the null
        threshold are no scores (results.json keeps the script's layout)."""
        return "" if metric.endswith(NOT_SCORES) else "0-100"

    def dev_set_cost(self) -> str | None:
        return "SQuAD's: ~11,600 windows, ~10 min on 2 cores"

    def data_problems(self) -> list[str]:
        problems = super().data_problems()
        for option, split in (("--train-file", "train"), ("--dev-file", "dev")):
            path = self.file(split)
            if path is not None and not path.is_file():
                problems.append(f"{option}: {path} does not exist; pass the SQuAD JSON with {option}, or a --data "
                                f"folder holding train-v{self.version}.json and dev-v{self.version}.json.")
        return problems

    def file(self, split: str) -> Path | None:
        """The JSON of `split`: its flag, else in (or being) --data; None: HF datasets."""
        given = self.train_file if split == "train" else self.dev_file
        if given is not None:
            return Path(given)
        if self.data_path is None:
            return None
        return self.data_path if self.data_path.is_file() else self.data_path / f"{split}-v{self.version}.json"
