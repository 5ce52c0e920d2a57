"""The GLUE datasets as data (GLUE calls each a "task"): file layouts, labels and metrics per dataset; one reader
for the original TSVs and one thin wrapper for HF `datasets`, both producing the same `GlueExample`s.

The TSV layouts are those of the GLUE download (`download_glue_data.py`): CoLA train/dev have no
header (source, label, original label, sentence), MRPC starts with a UTF-8 BOM, MNLI has matched and
mismatched dev/test files, STS-B labels are similarity scores in [0, 5]. Text fields may contain
quote characters, so lines are split on tabs only (no CSV quoting), as GLUE's own loaders do.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from widenet_ds.errors import ConfigError, DataError
from widenet_ds.fs.atomic import atomic_write_text

Column = str | int  # a header name, or a 0-based position for headerless files


@dataclass(frozen=True)
class Layout:
    """Where the fields of one kind of TSV live."""

    has_header: bool
    text_a: Column
    text_b: Column | None = None
    label: Column | None = None  # None: an unlabelled test file
    index: Column | None = None  # the id the GLUE server matches predictions on


@dataclass(frozen=True)
class GlueDataset:
    name: str  # the GLUE folder name, also the submission file stem
    files: dict[str, str]  # split -> file name
    labelled: Layout
    test: Layout
    labels: tuple[str, ...]  # label strings as in the TSV; () for regression
    metrics: tuple[str, ...]
    primary_metric: str  # what "median over seeds" and model selection look at
    # What label i means, one name per entry of `labels` (the names GLUE and HF `datasets` give them; the TSV's
    # own words where it has words, not 0/1): the id2label of exported models. () for regression.
    label_names: tuple[str, ...] = ()
    eval_splits: tuple[str, ...] = ("dev",)
    # What evaluating the whole dev set costs on a few CPU cores, when it takes minutes (the small ones: seconds).
    dev_set_cost: str | None = None
    test_splits: dict[str, str] = field(default_factory=lambda: {"test": ""})  # split -> submission stem
    hf_name: str = ""
    hf_text: tuple[str, str | None] = ("sentence", None)
    hf_splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"})

    def __post_init__(self) -> None:
        if len(self.label_names) != len(self.labels):
            raise ValueError(f"GlueDataset {self.name}: label_names {self.label_names} must name each of the labels "
                             f"{self.labels}, in their order.")

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.labels)

    def submission_name(self, split: str) -> str:
        """`CoLA.tsv`, `MNLI-m.tsv`... for test splits (what the GLUE server expects); `CoLA.dev.tsv` else."""
        if split in self.test_splits:
            return f"{self.test_splits[split] or self.name}.tsv"
        return f"{self.name}.{split}.tsv"


_PAIR = dict(text_a="sentence1", text_b="sentence2")
_STD_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_MNLI_LABELS = ("contradiction", "entailment", "neutral")
_NLI_PAIR = ("entailment", "not_entailment")

GLUE_DATASETS: dict[str, GlueDataset] = {
    t.name: t
    for t in [
        GlueDataset("CoLA", _STD_FILES, Layout(False, text_a=3, label=1),
                 Layout(True, text_a="sentence", index="index"),
                 labels=("0", "1"), label_names=("unacceptable", "acceptable"), metrics=("mcc",),
                 primary_metric="mcc", hf_name="cola"),
        GlueDataset("SST-2", _STD_FILES, Layout(True, text_a="sentence", label="label"),
                 Layout(True, text_a="sentence", index="index"),
                 labels=("0", "1"), label_names=("negative", "positive"), metrics=("acc",), primary_metric="acc",
                 hf_name="sst2"),
        GlueDataset("MRPC", _STD_FILES, Layout(True, text_a="#1 String", text_b="#2 String", label="Quality"),
                 Layout(True, text_a="#1 String", text_b="#2 String", index="index"),
                 labels=("0", "1"), label_names=("not_equivalent", "equivalent"),
                 metrics=("acc", "f1", "acc_and_f1"), primary_metric="acc_and_f1",
                 hf_name="mrpc", hf_text=("sentence1", "sentence2")),
        GlueDataset("STS-B", _STD_FILES, Layout(True, **_PAIR, label="score", index="index"),
                 Layout(True, **_PAIR, index="index"),
                 labels=(), metrics=("pearson", "spearmanr", "corr"), primary_metric="corr",
                 hf_name="stsb", hf_text=("sentence1", "sentence2")),
        GlueDataset("QQP", _STD_FILES, Layout(True, text_a="question1", text_b="question2", label="is_duplicate", index="id"),
                 Layout(True, text_a="question1", text_b="question2", index="id"),
                 labels=("0", "1"), label_names=("not_duplicate", "duplicate"),
                 metrics=("acc", "f1", "acc_and_f1"), primary_metric="acc_and_f1", dev_set_cost="QQP's: 40,430 pairs",
                 hf_name="qqp", hf_text=("question1", "question2")),
        GlueDataset("MNLI",
                 {"train": "train.tsv", "dev_matched": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv",
                  "test_matched": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv"},
                 Layout(True, **_PAIR, label="gold_label", index="index"), Layout(True, **_PAIR, index="index"),
                 labels=_MNLI_LABELS, label_names=_MNLI_LABELS, metrics=("acc",), primary_metric="acc",
                 eval_splits=("dev_matched", "dev_mismatched"), dev_set_cost="MNLI's: 19,647 pairs",
                 test_splits={"test_matched": "MNLI-m", "test_mismatched": "MNLI-mm"},
                 hf_name="mnli", hf_text=("premise", "hypothesis"),
                 hf_splits={"train": "train", "dev_matched": "validation_matched",
                            "dev_mismatched": "validation_mismatched", "test_matched": "test_matched",
                            "test_mismatched": "test_mismatched"}),
        GlueDataset("QNLI", _STD_FILES, Layout(True, text_a="question", text_b="sentence", label="label", index="index"),
                 Layout(True, text_a="question", text_b="sentence", index="index"),
                 labels=_NLI_PAIR, label_names=_NLI_PAIR, metrics=("acc",), primary_metric="acc",
                 dev_set_cost="QNLI's: 5,463 pairs", hf_name="qnli", hf_text=("question", "sentence")),
        GlueDataset("RTE", _STD_FILES, Layout(True, **_PAIR, label="label", index="index"),
                 Layout(True, **_PAIR, index="index"),
                 labels=_NLI_PAIR, label_names=_NLI_PAIR, metrics=("acc",), primary_metric="acc",
                 hf_name="rte", hf_text=("sentence1", "sentence2")),
        GlueDataset("WNLI", _STD_FILES, Layout(True, **_PAIR, label="label", index="index"),
                 Layout(True, **_PAIR, index="index"),
                 labels=("0", "1"), label_names=("not_entailment", "entailment"), metrics=("acc",),
                 primary_metric="acc", hf_name="wnli", hf_text=("sentence1", "sentence2")),
        # The diagnostic set: test-only, predicted by the MNLI model, scored by the GLUE server.
        GlueDataset("AX", {"test": "AX.tsv"}, Layout(True, **_PAIR, index="index"), Layout(True, **_PAIR, index="index"),
                 labels=_MNLI_LABELS, label_names=_MNLI_LABELS, metrics=("mcc",), primary_metric="mcc",
                 eval_splits=(),
                 hf_name="ax", hf_text=("premise", "hypothesis"), hf_splits={"test": "test"}),
    ]
}
_ALIASES = {name.lower().replace("-", ""): name for name in GLUE_DATASETS} | {"mnlimm": "MNLI", "mnlim": "MNLI"}
# The datasets a model is finetuned on (AX, the diagnostic set, has no labelled split), as the help names them.
FINETUNED_NAMES = tuple(dataset.hf_name for dataset in GLUE_DATASETS.values() if dataset.eval_splits)


def get_glue_dataset(name: str) -> GlueDataset:
    """The registry entry for `name`, case- and dash-insensitive (`sst2`, `SST-2`, `sts-b`)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in _ALIASES:
        raise ConfigError(f"unknown GLUE task {name!r}; known tasks: {', '.join(GLUE_DATASETS)}")
    return GLUE_DATASETS[_ALIASES[key]]


@dataclass(frozen=True)
class GlueExample:
    guid: str  # the file's index column, else the 0-based data row number; predictions are matched on it
    text_a: str
    text_b: str | None
    label: int | float | None  # class index, regression target, or None for test data


@dataclass
class GlueSplit:
    """The examples of one split and an account of every row that was not used."""

    task: GlueDataset
    split: str
    source: str
    examples: list[GlueExample]
    n_rows: int
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    skipped_lines: dict[str, list[int]] = field(default_factory=dict)  # reason -> first few line numbers

    def summary(self) -> str:
        text = f"{self.task.name} {self.split} ({self.source}): {self.n_rows} rows, {len(self.examples)} used"
        if not self.skipped:
            return text + ", 0 skipped"
        reasons = "; ".join(f"{n} {reason} (lines {self.skipped_lines[reason]})" for reason, n in self.skipped.items())
        return f"{text}, {sum(self.skipped.values())} skipped: {reasons}"


def _resolve(header: list[str] | None, col: Column, path: Path, what: str) -> int:
    if isinstance(col, int):
        return col
    assert header is not None, "a named column needs a header layout"
    if col not in header:
        raise DataError(f"{path}, line 1: the header has no {what} column {col!r} (found {header}); "
                        f"is this the right file for this task?")
    return header.index(col)


def read_glue_tsv(task: GlueDataset | str, path: str | os.PathLike, labelled: bool = True, split: str = "") -> GlueSplit:
    """Read one GLUE TSV. A header without a needed column is an error; a malformed row is skipped and
    counted with its reason; a file where no row can be used is an error naming the first problem."""
    task = get_glue_dataset(task) if isinstance(task, str) else task
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    layout = task.labelled if labelled else task.test
    if labelled and layout.label is None:
        raise ConfigError(f"{task.name} has no labelled split in the GLUE layout; read {path} with labelled=False")
    # utf-8-sig drops MRPC's BOM; newline="" and split("\n") so that stray \r or U+2028 inside a
    # sentence do not split a row, as str.splitlines would.
    with open(path, encoding="utf-8-sig", newline="") as f:
        lines = [line[:-1] if line.endswith("\r") else line for line in f.read().split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    first_data_line = 1
    header = None
    if layout.has_header:
        if not lines:
            raise DataError(f"{path}: empty file, expected a header line")
        header = lines[0].split("\t")
        first_data_line = 2
    named = {"text_a": layout.text_a, "text_b": layout.text_b, "label": layout.label, "index": layout.index}
    cols = {k: _resolve(header, c, path, k) for k, c in named.items() if c is not None}
    need = max(cols.values()) + 1

    result = GlueSplit(task, split or path.stem, str(path), [], n_rows=len(lines) - first_data_line + 1)

    def skip(reason: str, line_no: int) -> None:
        result.skipped[reason] += 1
        result.skipped_lines.setdefault(reason, [])
        if len(result.skipped_lines[reason]) < 5:
            result.skipped_lines[reason].append(line_no)

    for row, line in enumerate(lines[first_data_line - 1:]):
        line_no = row + first_data_line
        fields = line.split("\t")
        if len(fields) < need:
            missing = [f"{k} (column {c if isinstance(c, int) else repr(c)})"
                       for k, c in named.items() if c is not None and cols[k] >= len(fields)]
            skip(f"malformed line: {len(fields)} fields, missing {', '.join(missing)}", line_no)
            continue
        label: int | float | None = None
        if labelled:
            raw = fields[cols["label"]].strip()
            if task.is_regression:
                try:
                    label = float(raw)
                except ValueError:
                    skip(f"label {raw!r} is not a number", line_no)
                    continue
            elif raw in task.labels:
                label = task.labels.index(raw)
            else:
                skip(f"label {raw!r} not one of {list(task.labels)}", line_no)
                continue
        guid = fields[cols["index"]] if "index" in cols else str(row)
        text_b = fields[cols["text_b"]] if "text_b" in cols else None
        result.examples.append(GlueExample(guid, fields[cols["text_a"]], text_b, label))

    if result.n_rows > 0 and not result.examples:
        reason, n = result.skipped.most_common(1)[0]
        raise DataError(f"{path}: none of the {result.n_rows} rows could be used for {task.name}; "
                        f"line {result.skipped_lines[reason][0]}: {reason}")
    return result


def glue_split_path(task: GlueDataset, split: str, data_dir: str | os.PathLike) -> Path:
    """The TSV of `split` in `data_dir`, which may be the task folder or the GLUE root above it."""
    if split not in task.files:
        raise ConfigError(f"{task.name} has no split {split!r}; splits: {', '.join(task.files)}")
    data_dir = Path(data_dir)
    for candidate in (data_dir / task.files[split], data_dir / task.name / task.files[split]):
        if candidate.is_file():
            return candidate
    raise DataError(f"no {task.files[split]} in {data_dir} (nor in {data_dir / task.name}); pass the folder holding "
                    f"the {task.name} TSVs, or no data folder to download through HF datasets")


def load_glue_split(task: GlueDataset | str, split: str, data_dir: str | os.PathLike | None = None) -> GlueSplit:
    """Examples of one split from local GLUE TSVs (`data_dir`) or, with no `data_dir`, from HF `datasets`."""
    task = get_glue_dataset(task) if isinstance(task, str) else task
    labelled = split not in task.test_splits
    if data_dir is not None:
        return read_glue_tsv(task, glue_split_path(task, split, data_dir), labelled=labelled, split=split)
    if split not in task.hf_splits:
        raise ConfigError(f"{task.name} has no split {split!r}; splits: {', '.join(task.hf_splits)}")
    import datasets  # lazy: only the download path needs it

    ds = datasets.load_dataset("glue", task.hf_name, split=task.hf_splits[split])
    label_names = ds.features["label"].names if "label" in ds.features else []
    return glue_split_from_hf_rows(task, split, ds, label_names, labelled=labelled)


def glue_split_from_hf_rows(task: GlueDataset, split: str, rows: Iterable[dict], label_names: Sequence[str],
                            labelled: bool = True) -> GlueSplit:
    """Map HF `glue` rows (`idx`, text columns, integer `label`; -1 on test) into GlueExamples.

    HF label order differs from the TSVs for some tasks (MNLI: entailment, neutral, contradiction),
    so labels go through their names; tasks whose TSV labels are 0/1 keep the integer."""
    col_a, col_b = task.hf_text
    result = GlueSplit(task, split, f"hf:glue/{task.hf_name}", [], n_rows=0)
    for row in rows:
        result.n_rows += 1
        label: int | float | None = None
        raw = row.get("label", -1)
        if labelled and raw != -1:
            if task.is_regression:
                label = float(raw)
            else:
                name = label_names[raw] if label_names and label_names[raw] in task.labels else str(raw)
                label = task.labels.index(name)
        result.examples.append(GlueExample(str(row["idx"]), row[col_a], row[col_b] if col_b else None, label))
    return result


def write_glue_predictions(task: GlueDataset | str, split: str, guids: Sequence[str], predictions: Sequence,
                           out_dir: str | os.PathLike) -> Path:
    """Write `index<TAB>prediction` rows as the GLUE server expects: label strings for classification
    (class indices are mapped back), scores with 3 decimals for STS-B."""
    task = get_glue_dataset(task) if isinstance(task, str) else task
    if len(guids) != len(predictions):
        raise ValueError(f"{len(guids)} ids but {len(predictions)} predictions")
    rows = ["index\tprediction"]
    for guid, pred in zip(guids, predictions):
        value = f"{float(pred):.3f}" if task.is_regression else task.labels[int(pred)]
        rows.append(f"{guid}\t{value}")
    return atomic_write_text(Path(out_dir) / task.submission_name(split), "\n".join(rows) + "\n")


def read_glue_predictions(task: GlueDataset | str, path: str | os.PathLike) -> dict[str, int | float]:
    """Read a file written by `write_glue_predictions` (or for the GLUE server) back: guid -> prediction."""
    task = get_glue_dataset(task) if isinstance(task, str) else task
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    lines = path.read_text(encoding="utf-8-sig").rstrip("\n").split("\n")
    if lines[0].split("\t")[:2] != ["index", "prediction"]:
        raise DataError(f"{path}, line 1: expected the header 'index<TAB>prediction', found {lines[0]!r}")
    out: dict[str, int | float] = {}
    for line_no, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}, line {line_no}: expected 2 tab-separated fields, found {len(fields)}")
        guid, value = fields
        if guid in out:
            raise DataError(f"{path}, line {line_no}: index {guid!r} appears twice")
        if task.is_regression:
            try:
                out[guid] = float(value)
            except ValueError:
                raise DataError(f"{path}, line {line_no}: prediction {value!r} is not a number") from None
        elif value in task.labels:
            out[guid] = task.labels.index(value)
        else:
            raise DataError(f"{path}, line {line_no}: prediction {value!r} is not a {task.name} label {list(task.labels)}")
    return out
