"""Your own labelled texts, read into the GLUE task's examples: the rows of a file (CSV, TSV, JSON lines, Parquet) or
of a HF dataset's splits become `GlueExample`s of a `GlueDataset` that describes them (their fields, their labels in
order, their metrics), so that the GLUE task's features, predictions and metrics serve them as they are.

What would make a run train on the wrong thing is refused before anything is built, each with its fix: a file in
another encoding than UTF-8, an empty file, a row whose fields do not fit the header, a missing field (the message
names the fields the file has), a row without its text or label, a label column mixing numbers and text, numbers
with fractions taken as classes (they are scores: --regression), a single class, and labels in the validation split
that training never saw (the model would have no class for them).

The formats: CSV as RFC 4180 (quoted fields may hold commas, quotes, newlines); TSV as GLUE's files and the IANA type
(one row a line, fields split at tabs, quote characters are text); JSON lines (a .json file may instead hold one JSON
list of objects); Parquet. Text files are UTF-8 (a byte-order mark is dropped). A label written as a number ("1" in
a CSV, 1 in JSON) is that number, in every format alike; classes are named by their text (numbers by their value)
and ordered by it (numbers by value), as HF's run_glue.py sorts them; a HF dataset's ClassLabel keeps its own names
and order.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from widenet_ds.errors import DataError
from widenet_ds.tasks.glue.datasets import GlueDataset, GlueExample, GlueSplit, Layout

FORMATS = {".csv": "CSV", ".tsv": "TSV", ".jsonl": "JSON lines", ".json": "JSON", ".parquet": "Parquet"}
SPLIT_STEMS = {"train": ("train",), "validation": ("validation", "dev")}  # the files' names in a --data folder
SPLITS = ("train", "validation")
CLASSIFICATION_METRICS = ("acc", "macro_f1")
REGRESSION_METRICS = ("pearson", "spearmanr", "corr")
SHOWN = 3  # rows a message names


@dataclass
class Records:
    """The rows of one file or HF split as read: each row's fields, and where each row is."""

    source: str  # what the messages name: the file, or the HF dataset's split
    fields: list[str]  # the fields it has, in their order
    rows: list[dict[str, Any]]
    places: list[str]  # "line 7", "row 3": where each row is
    class_names: dict[str, list[str]] = field(default_factory=dict)  # a HF ClassLabel field's names


# --- reading ------------------------------------------------------------------------------------------------------
def read_file(path: Path) -> Records:
    """The rows of a .csv, .tsv, .jsonl/.json or .parquet file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{path}: {suffix or 'no suffix'} is no format this task reads; save it as "
                        f"{', '.join(FORMATS)}.")
    records = _parquet(path) if suffix == ".parquet" else _text_records(path, suffix, _utf8(path))
    if not records.rows:
        raise DataError(f"{path} holds no examples (a header only); add labelled rows, or pass another file.")
    return records


def _utf8(path: Path) -> str:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            encoding, name, other = "UTF-16 (what spreadsheets save as \"Unicode text\")", "utf16", ""
        else:
            encoding, name = "another encoding, e.g. Latin-1 or Windows-1252", "latin1"
            other = " (from Windows-1252: -f cp1252), or save it as UTF-8"
        raise DataError(f"{path} is not UTF-8 text: line {line} holds the byte 0x{raw[err.start]:02x}, so it is in "
                        f"{encoding}. Convert it to UTF-8: iconv -f {name} -t utf8 {path} > "
                        f"{path.with_name(path.stem + '.utf8' + path.suffix)}{other}") from None
    if not text.strip():
        raise DataError(f"{path} is empty; pass a file with a header and labelled rows.")
    return text


def _text_records(path: Path, suffix: str, text: str) -> Records:
    if suffix in (".jsonl", ".json"):
        return _json(path, text, lines=suffix == ".jsonl")
    if suffix == ".tsv":  # one row a line, split at tabs: quotes are text (GLUE's TSVs hold unpaired quotes)
        numbered = [(n, line.removesuffix("\r").split("\t")) for n, line in enumerate(text.split("\n"), start=1)]
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
        try:
            numbered = [(reader.line_num, fields) for fields in reader]
        except csv.Error as err:
            raise DataError(f"{path}, line {reader.line_num}: not CSV ({err}); quote a field that holds commas, "
                            f"quotes or newlines (\"a, b\"; a quote inside doubled: \"\")") from None
    numbered = [(n, fields) for n, fields in numbered if fields not in ([], [""])]  # blank lines
    if not numbered:
        raise DataError(f"{path} holds no header and no rows; pass a file with a header and labelled rows.")
    header = numbered[0][1]
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if duplicated:
        raise DataError(f"{path}, line {numbered[0][0]}: the header names {', '.join(map(repr, duplicated))} twice; "
                        f"give every column its own name.")
    rows, places = [], []
    for n, fields in numbered[1:]:
        if len(fields) != len(header):
            hint = ("a field holding a tab or a newline cannot be in a TSV: write the file as CSV or JSON lines"
                    if suffix == ".tsv" else "quote a field that holds commas (\"a, b\")")
            raise DataError(f"{path}, line {n}: {len(fields)} fields where the header (line {numbered[0][0]}) has "
                            f"{len(header)}; {hint}.")
        rows.append(dict(zip(header, fields)))
        places.append(f"line {n}")
    return Records(str(path), header, rows, places)


def _json(path: Path, text: str, lines: bool) -> Records:
    items: list[tuple[str, Any]] = []
    whole = None
    if not lines:
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # not one JSON value: JSON lines
    if isinstance(whole, list):
        items = [(f"item {i}", value) for i, value in enumerate(whole)]
    else:
        for n, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                items.append((f"line {n}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise DataError(f"{path}, line {n}: not JSON ({err.msg}); each line of a JSON lines file is one "
                                f"object, e.g. {{\"text\": \"...\", \"label\": \"...\"}}.") from None
    for place, value in items:
        if not isinstance(value, dict):
            raise DataError(f"{path}, {place}: a JSON {type(value).__name__}, not an object; each example is one "
                            f"object, e.g. {{\"text\": \"...\", \"label\": \"...\"}}.")
    fields = list(dict.fromkeys(name for _, value in items for name in value))
    return Records(str(path), fields, [value for _, value in items], [place for place, _ in items])


def _parquet(path: Path) -> Records:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path} cannot be read as Parquet ({err}); pass a Parquet file, or name the file by its "
                        f"format ({', '.join(FORMATS)}).") from None
    if table.num_columns == 0:
        raise DataError(f"{path} is empty; pass a file with labelled rows.")
    return Records(str(path), table.column_names, table.to_pylist(), [f"row {i}" for i in range(table.num_rows)])


def read_hf_dataset(spec: str) -> dict[str, Records]:
    """The train and validation splits of the HF dataset `NAME[@CONFIG]` (a hub name, or a local folder of data
    files), streamed: nothing is written to the HF cache."""
    import datasets  # only this reader needs it

    name, _, config = spec.partition("@")
    try:
        loaded = datasets.load_dataset(name, config or None, streaming=True)
    except (OSError, ValueError) as err:  # ConnectionError, DatasetNotFoundError, EmptyDatasetError, a wrong config
        raise _unreadable(spec, err) from None
    absent = [split for split in SPLITS if split not in loaded]
    if absent:
        raise DataError(f"--dataset {spec} has no {' and no '.join(absent)} split (its splits: {', '.join(loaded)}); "
                        f"pass the files of both with --train-file and --validation-file.")
    try:
        splits = {split: (loaded[split].features, list(loaded[split])) for split in SPLITS}
    except (OSError, ValueError) as err:  # a data file it cannot parse
        raise _unreadable(spec, err) from None
    out = {}
    for split, (features, rows) in splits.items():
        if not rows:
            raise DataError(f"--dataset {spec}: its {split} split holds no examples.")
        fields = list(features) if features else list(dict.fromkeys(column for row in rows for column in row))
        names = {column: list(feature.names) for column, feature in (features or {}).items()
                 if isinstance(feature, datasets.ClassLabel)}
        out[split] = Records(f"--dataset {spec}, split {split}", fields, rows, [f"row {i}" for i in range(len(rows))],
                             names)
    return out


def _unreadable(spec: str, err: Exception) -> DataError:
    return DataError(f"--dataset {spec}: HF datasets could not read it ({type(err).__name__}: {str(err)[:300]}); check "
                     f"the name and @CONFIG (offline: HF_DATASETS_OFFLINE=1 reads a copy in the HF cache), or pass the "
                     f"files with --train-file and --validation-file.")


# --- the examples -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Columns:
    """Which fields hold the texts (one, or a pair) and the label, and whether the labels are scores."""

    texts: tuple[str, ...]
    label: str
    regression: bool = False


def _shown(places: list[str]) -> str:
    more = f", and {len(places) - SHOWN} more" if len(places) > SHOWN else ""
    return ", ".join(places[:SHOWN]) + more


def _label_value(value: Any, records: Records, place: str, label: str) -> float | str | None:
    """A label as read: a number (also written as text: "1", " 2.5"), a text, or None (none)."""
    names = records.class_names.get(label)
    if names is not None and isinstance(value, int):  # a ClassLabel's index (-1: unlabelled)
        return names[value] if 0 <= value < len(names) else None
    if value is None or isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise DataError(f"{records.source}, {place}: the label {label!r} is a {type(value).__name__}, not a class "
                        f"name or a number.")
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        return text or None
    return number if math.isfinite(number) else text


def _labels(records: Records, columns: Columns) -> list[float | str]:
    """Every row's label, each of one kind: numbers, or (classes only) texts."""
    values = [_label_value(row.get(columns.label), records, place, columns.label)
              for row, place in zip(records.rows, records.places)]
    unlabelled = [place for place, value in zip(records.places, values) if value is None]
    if unlabelled:
        raise DataError(f"{records.source}: {len(unlabelled)} row(s) without a label in {columns.label!r} "
                        f"({_shown(unlabelled)}); label every example, or leave those rows out.")
    texts = [(place, value) for place, value in zip(records.places, values) if isinstance(value, str)]
    numbers = [(place, value) for place, value in zip(records.places, values) if isinstance(value, float)]
    if texts and numbers:
        raise DataError(f"{records.source}: the label field {columns.label!r} mixes numbers ({numbers[0][0]}: "
                        f"{numbers[0][1]:g}) and text ({texts[0][0]}: {texts[0][1]!r}); every label is a class name or "
                        f"every label a number (is a column shifted, or a header repeated in the file?).")
    if columns.regression and texts:
        raise DataError(f"{records.source}: --regression predicts numbers, but the labels are text ({texts[0][0]}: "
                        f"{texts[0][1]!r}); drop --regression to classify them.")
    fractions = [(place, value) for place, value in numbers if not value.is_integer()]
    if fractions and not columns.regression:
        raise DataError(f"{records.source}: the labels are numbers with fractions ({fractions[0][0]}: "
                        f"{fractions[0][1]:g}), scores rather than classes; pass --regression to predict them, or "
                        f"give each class a name.")
    return values


def _class_name(value: float | str) -> str:
    return str(int(value)) if isinstance(value, float) else value


def _class_names(records: Records, labels: list[float | str], label: str) -> tuple[str, ...]:
    """The training split's classes in order: a ClassLabel's; numbers by value; names sorted."""
    if label in records.class_names:
        return tuple(records.class_names[label])
    return tuple(_class_name(v) for v in sorted(set(labels), key=lambda v: (isinstance(v, str), v)))


def _texts(records: Records, columns: Columns) -> list[tuple[str, ...]]:
    """Every row's text (or pair of texts), once the records are known to have the fields named."""
    absent = [name for name in (*columns.texts, columns.label) if name not in records.fields]
    if absent:
        flags = " and ".join(flag for flag, names in (("--text-fields", columns.texts), ("--label-field",
                                                                                        (columns.label,)))
                             if set(names) & set(absent))
        raise DataError(f"{records.source} has no field {' and no '.join(map(repr, absent))}; its fields: "
                        f"{', '.join(records.fields)}. Name the text and label fields with {flags}.")
    texts = []
    for row, place in zip(records.rows, records.places):
        values = tuple(row.get(name) for name in columns.texts)
        bad = [name for name, value in zip(columns.texts, values) if not isinstance(value, str)]
        if bad:
            value = row.get(bad[0])
            held = "nothing" if value is None else f"{value!r} ({type(value).__name__})"
            raise DataError(f"{records.source}, {place}: the text field {bad[0]!r} holds {held}, not a text; give every "
                            f"example its text (is --text-fields the field of the texts?).")
        texts.append(values)
    return texts


def labelled_splits(splits: dict[str, Records], columns: Columns, name: str
                    ) -> tuple[GlueDataset, dict[str, GlueSplit]]:
    """The dataset the splits are (its classes found in the training split) and each split's examples."""
    texts = {split: _texts(records, columns) for split, records in splits.items()}
    labels = {split: _labels(records, columns) for split, records in splits.items()}
    names: tuple[str, ...] = ()
    if not columns.regression:
        names = _class_names(splits["train"], labels["train"], columns.label)
        if len(names) < 2:
            raise DataError(f"{splits['train'].source}: every label is {names[0]!r}; a classifier needs examples of "
                            f"two classes or more.")
        for split, records in splits.items():
            unseen = [(place, _class_name(v)) for place, v in zip(records.places, labels[split])
                      if _class_name(v) not in names]
            if unseen:
                shown = ", ".join(dict.fromkeys(repr(label) for _, label in unseen))
                raise DataError(f"{records.source}: label(s) {shown} ({_shown([p for p, _ in unseen])}) never appear "
                                f"in the training file {splits['train'].source}, so the model has no class for them "
                                f"(its classes: {', '.join(names)}); add training examples of them, or leave them out "
                                f"of the {split} file.")
    pair = len(columns.texts) == 2
    layout = Layout(True, text_a=columns.texts[0], text_b=columns.texts[1] if pair else None)
    dataset = GlueDataset(
        name, {split: records.source for split, records in splits.items()},
        Layout(True, text_a=layout.text_a, text_b=layout.text_b, label=columns.label), layout, labels=names,
        label_names=names, metrics=REGRESSION_METRICS if columns.regression else CLASSIFICATION_METRICS,
        primary_metric="pearson" if columns.regression else "acc", eval_splits=("validation",), test_splits={})
    index = {label: i for i, label in enumerate(names)}
    out = {}
    for split, records in splits.items():
        examples = [GlueExample(str(i), text[0], text[1] if pair else None,
                                value if columns.regression else index[_class_name(value)])
                    for i, (text, value) in enumerate(zip(texts[split], labels[split]))]
        out[split] = GlueSplit(dataset, split, records.source, examples, n_rows=len(records.rows))
    return dataset, out
