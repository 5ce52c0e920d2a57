"""The settings of finetuning on your own labelled texts: where they are (files, or a HF dataset with its splits),
which fields hold the text (or the pair of texts) and the label, and whether the labels are classes or scores."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from widenet_ds.tasks.finetune.config import TRAIN_FILE_HELP, FinetuneConfig
from widenet_ds.tasks.text_classification.data import FORMATS, SPLIT_STEMS
from widenet_ds.training.flags import flag
from widenet_ds.training.run_config import DATA_HELP, DATASET_HELP, HF_DATA, missing

_SOURCES = "--train-file and --validation-file, a --data folder holding train.EXT and validation.EXT, or --dataset"


def field_names(text: str) -> tuple[str, ...]:
    """`A` or `A,B`: the field of the text, or the two fields of a pair."""
    names = tuple(part.strip() for part in text.split(","))
    if not 1 <= len(names) <= 2 or not all(names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected one field name, or two different ones for a pair of "
                                         f"texts (A,B), e.g. sentence1,sentence2")
    return names


@dataclass(kw_only=True)
class TextClassificationConfig(FinetuneConfig):
    """Sentence or sentence-pair classification (or regression, with --regression) on labelled texts of your own:
    CSV, TSV, JSON lines or Parquet files, or a HF dataset's train and validation splits."""

    TASK: ClassVar[str] = "text-classification"  # transformers' name of the same task (its pipeline, its example)
    DESCRIPTION: ClassVar[str] = ("Finetuning on your own labelled texts: CSV, TSV, JSON lines, Parquet or a HF "
                                  "dataset (seeds, median of each metric).")
    PATH_SETTINGS: ClassVar[frozenset[str]] = FinetuneConfig.PATH_SETTINGS | {"train_file", "validation_file"}

    data: str | None = field(default=None, metadata=flag(DATA_HELP))
    train_file: str | None = field(default=None, metadata=flag(TRAIN_FILE_HELP))
    validation_file: str | None = field(default=None, metadata=flag(
        "the labelled file to score on, in any of the training file's formats (default: validation.EXT or dev.EXT "
        "in --data)"))
    dataset: str | None = field(default=None, metadata=flag(DATASET_HELP))
    text_fields: tuple[str, ...] = field(default=("text",), metadata=flag(
        "the field holding the text, or the two fields of a pair of texts", parse=field_names, metavar="A[,B]"))
    label_field: str = field(default="label", metadata=flag("the field holding the label"))
    regression: bool = field(default=False, metadata=flag(
        "the labels are numbers to predict (scores, as STS-B's), not classes"))

    def __post_init__(self) -> None:
        self.text_fields = tuple(self.text_fields)  # (a saved record holds a list)
        super().__post_init__()

    def problems(self) -> list[str]:
        problems = super().problems()
        files = self.names_files
        if self.dataset is not None and files:
            problems.append(f"--dataset reads the HF dataset's own splits; drop {' and '.join(files)}, or drop "
                            f"--dataset to train on the files.")
        elif self.dataset is None and not files:
            problems.append(f"nothing to train on: pass {_SOURCES} NAME[@CONFIG] (a HF dataset).")
        if self.data == HF_DATA:
            problems.append("--data hf: name the HF dataset with --dataset NAME[@CONFIG] instead.")
        for option, value in (("--train-file", self.train_file), ("--validation-file", self.validation_file)):
            if value is not None and Path(value).suffix.lower() not in FORMATS:
                problems.append(f"{option} {value}: {Path(value).suffix or 'a file without a suffix'} is no format "
                                f"this task reads; save it as {', '.join(FORMATS)} (the suffix names the format).")
        if self.label_field in self.text_fields:
            problems.append(f"--label-field {self.label_field} is also one of --text-fields; name the field that "
                            f"holds the label.")
        return problems

    def data_problems(self) -> list[str]:
        if self.dataset is not None or self.data == HF_DATA or not self.names_files:  # (refused by problems())
            return []
        if self.data is not None and not Path(self.data).is_dir():
            return missing("--data", Path(self.data), "pass the folder holding the files") or [
                f"--data {self.data} is a file; pass it as --train-file (with --validation-file), or pass the "
                f"folder holding train.EXT and validation.EXT."]
        problems = []
        for split, option in (("train", "--train-file"), ("validation", "--validation-file")):
            given = self.train_file if split == "train" else self.validation_file
            if given is not None:
                problems += missing(option, Path(given), f"pass the {split} file ({', '.join(FORMATS)})")
                continue
            found = self.files_in_data(split)
            if len(found) != 1:
                names = " or ".join(f"{stem}.EXT" for stem in SPLIT_STEMS[split])
                problems.append(f"--data {self.data} holds {' and '.join(p.name for p in found)}: pass {option} to "
                                f"choose one." if found else f"no {split} file: pass {option}, or a --data folder "
                                f"holding {names} (EXT: {', '.join(s[1:] for s in FORMATS)}).")
        return problems

    @property
    def names_files(self) -> list[str]:
        """The options that name files to train on (--data, --train-file, --validation-file)."""
        return [option for option, value in (("--data", self.data), ("--train-file", self.train_file),
                                             ("--validation-file", self.validation_file)) if value is not None]

    def files_in_data(self, split: str) -> list[Path]:
        """The files of `split` ("train", "validation") in --data (train.csv, dev.jsonl, ...)."""
        if self.data_path is None or not self.data_path.is_dir():
            return []
        return sorted(path for stem in SPLIT_STEMS[split] for path in self.data_path.glob(f"{stem}.*")
                      if path.suffix.lower() in FORMATS)

    def split_file(self, split: str) -> Path:
        """The file of `split` ("train", "validation"): its flag, else the one in --data (checked to be there by
        `data_problems`)."""
        given = self.train_file if split == "train" else self.validation_file
        return Path(given) if given is not None else self.files_in_data(split)[0]

    @property
    def data_path(self) -> Path | None:
        return None if self.data in (None, HF_DATA) else Path(self.data)

    @property
    def data_name(self) -> str:
        """What the run calls the data (its log, results.json's "task", the predictions' file): the HF dataset's
        name, --data's folder's, or the training file's (its folder's when the file is a train.EXT)."""
        if self.dataset is not None:
            name, _, config = self.dataset.rstrip("/").partition("@")
            return "-".join(part for part in (Path(name).name, config) if part)
        if self.data_path is not None:
            return self.data_path.resolve().name
        train = Path(self.train_file or "data").resolve()
        return train.parent.name if train.stem in SPLIT_STEMS["train"] and train.parent.name else train.stem

    @classmethod
    def names_a_path(cls, name: str, value: Any) -> bool:
        """A --dataset is a file's path when it names a local folder (as HF datasets reads it), else a hub name."""
        if name == "dataset":
            return isinstance(value, str) and Path(value.partition("@")[0]).exists()
        return super().names_a_path(name, value)
