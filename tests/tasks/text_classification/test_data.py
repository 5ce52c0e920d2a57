"""Your own labelled texts read into the GLUE task's examples: the shared GLUE files rewritten in every format give
exactly the examples GLUE's own reader gives (texts, label names, order); a HF dataset's splits and its ClassLabel
names; the order of the classes; CSV's quoting. (Each refusal of a bad file is a row of
tests/integration/test_bad_inputs.py.)"""

from __future__ import annotations

import pytest

from tests.support.labelled_files import glue_rows, typed, write_rows
from widenet_ds.tasks.glue.datasets import read_glue_tsv
from widenet_ds.tasks.text_classification.data import Columns, labelled_splits, read_file, read_hf_dataset

PAIRS = Columns(("sentence1", "sentence2"), "label")


def examples(split) -> list[tuple]:
    """(id, text, second text, label name) of each example of a GlueSplit."""
    names = split.task.labels
    return [(e.guid, e.text_a, e.text_b, names[e.label] if names else e.label) for e in split.examples]


def read_as_training_and_validation(path, columns):
    records = read_file(path)
    return labelled_splits({"train": records, "validation": records}, columns, "mine")


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".json", ".parquet"])
def test_every_format_gives_the_examples_glues_reader_gives(shared_data, tmp_path, suffix):
    """RTE's dev pairs (text labels) and SST-2's dev sentences (number labels, as numbers in JSON and Parquet)."""
    for name, columns, types in (("RTE", PAIRS, {}), ("SST-2", Columns(("sentence",), "label"), {"label": int})):
        tsv = shared_data / "glue" / name / "dev.tsv"
        header, rows = glue_rows(tsv)
        typed_rows = typed(rows, **types) if suffix in (".jsonl", ".json", ".parquet") else rows
        path = write_rows(tmp_path / f"{name}{suffix}", typed_rows)
        dataset, splits = read_as_training_and_validation(path, columns)
        glue = read_glue_tsv(name, tsv, split="dev")
        assert examples(splits["validation"]) == examples(glue), (name, suffix)
        assert dataset.labels == dataset.label_names == glue.task.labels  # the same classes, in the same order
        assert (dataset.num_labels, dataset.is_regression, dataset.primary_metric) == (2, False, "acc")


def test_the_glue_folders_themselves_are_read_with_their_fields(shared_data):
    dataset, splits = read_as_training_and_validation(shared_data / "glue/STS-B/dev.tsv",
                                                      Columns(("sentence1", "sentence2"), "score", regression=True))
    glue = read_glue_tsv("STS-B", shared_data / "glue/STS-B/dev.tsv", split="dev")
    assert [e.label for e in splits["train"].examples] == [e.label for e in glue.examples]  # the scores
    assert [e.text_b for e in splits["train"].examples] == [e.text_b for e in glue.examples]
    assert dataset.is_regression and dataset.num_labels == 1 and dataset.label_names == ()
    assert dataset.metrics == ("pearson", "spearmanr", "corr") and dataset.primary_metric == "pearson"


def test_classes_are_ordered_by_name_numbers_by_value_and_written_alike_in_every_format(tmp_path):
    texts = write_rows(tmp_path / "t.csv", [{"text": "x", "label": label} for label in ("pos", "neg", "mixed", "neg")])
    dataset, splits = read_as_training_and_validation(texts, Columns(("text",), "label"))
    assert dataset.label_names == ("mixed", "neg", "pos")
    assert [e.label for e in splits["train"].examples] == [2, 1, 0, 1]
    # numbers by value (10 after 9, not after 1), whether written as text or as JSON numbers
    numbers = [9, 10, 1, " 2 "]
    for path in (write_rows(tmp_path / "n.csv", [{"text": "x", "label": n} for n in numbers]),
                 write_rows(tmp_path / "n.jsonl", [{"text": "x", "label": n} for n in numbers])):
        dataset, splits = read_as_training_and_validation(path, Columns(("text",), "label"))
        assert dataset.label_names == ("1", "2", "9", "10"), path
        assert [e.label for e in splits["train"].examples] == [2, 3, 0, 1], path


def test_csv_fields_may_hold_commas_quotes_and_newlines_and_a_json_file_a_list(tmp_path):
    rows = [{"text": 'he said "fine, thanks"\nand left', "label": "a"}, {"text": "plain", "label": "b"}]
    for path in (write_rows(tmp_path / "q.csv", rows), write_rows(tmp_path / "q.json", rows)):
        _, splits = read_as_training_and_validation(path, Columns(("text",), "label"))
        assert [(e.text_a, e.label) for e in splits["train"].examples] == [(rows[0]["text"], 0), ("plain", 1)]
    assert read_file(tmp_path / "q.csv").places == ["line 3", "line 4"]  # where each row ends (its quoted newline)


def test_a_hf_dataset_gives_its_splits_and_keeps_its_classlabel_names(tmp_path):
    """A local folder of data files, as HF datasets reads one (here: Parquet files written by `datasets`, which
    record the label's ClassLabel: its names in its own order, not sorted)."""
    import datasets

    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["positive", "negative"])})
    for split, labels in (("train", [0, 1, 1]), ("validation", [1, 0])):
        datasets.Dataset.from_dict({"sentence": [f"{split} {i}" for i in range(len(labels))], "label": labels},
                                   features=features).to_parquet(str(tmp_path / "mine" / f"{split}.parquet"))
    records = read_hf_dataset(str(tmp_path / "mine"))
    assert set(records) == {"train", "validation"} and records["train"].fields == ["sentence", "label"]
    dataset, splits = labelled_splits(records, Columns(("sentence",), "label"), "mine")
    assert dataset.label_names == ("positive", "negative")
    assert examples(splits["validation"]) == [("0", "validation 0", None, "negative"),
                                              ("1", "validation 1", None, "positive")]
