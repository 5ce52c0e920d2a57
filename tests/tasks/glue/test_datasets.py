"""GLUE registry, TSV reader, HF mapping, submission files and `glue-eval`, on the real shared TSVs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.support.tasks_fixtures import bert_tokenizer  # noqa: F401  (fixture)
from widenet_ds.errors import ConfigError, DataError
from widenet_ds.tasks.finetune.features import glue_features
from widenet_ds.tasks.glue.datasets import (
    GLUE_DATASETS,
    get_glue_dataset,
    glue_split_from_hf_rows,
    load_glue_split,
    read_glue_predictions,
    read_glue_tsv,
    write_glue_predictions,
)
from widenet_ds.tasks.glue.metrics import cli, glue_metrics

# Every shared file: (task, split) and how many rows a plain line count says it has.
SHARED = [("CoLA", "train"), ("CoLA", "dev"), ("CoLA", "test"), ("SST-2", "train"), ("SST-2", "dev"),
          ("MRPC", "train"), ("MRPC", "dev"), ("STS-B", "train"), ("STS-B", "dev"), ("STS-B", "test"),
          ("QNLI", "dev"), ("RTE", "train"), ("RTE", "dev")]


def _data_rows(path, has_header: bool) -> int:
    lines = path.read_bytes().split(b"\n")
    lines = lines[:-1] if lines[-1] == b"" else lines
    return len(lines) - has_header


def test_every_shared_row_is_used_or_reported(shared_data, bert_tokenizer, capsys):
    glue = shared_data / "glue"
    for name, split in SHARED:
        task = GLUE_DATASETS[name]
        loaded = load_glue_split(name, split, glue)
        layout = task.test if split == "test" else task.labelled
        rows = _data_rows(glue / name / f"{split}.tsv", layout.has_header)
        assert loaded.n_rows == rows
        assert len(loaded.examples) + sum(loaded.skipped.values()) == rows
        if split != "train":  # the big train files: reading is enough; dev/test also go through the tokenizer
            feats = glue_features(loaded, bert_tokenizer, max_seq_length=128)
            assert len(feats) == len(loaded.examples)
            assert max(len(x) for x in feats.input_ids) <= 128
            print(feats.summary_text)
        else:
            print(loaded.summary())
    out = capsys.readouterr().out
    # Known sizes (SOURCES.md), printed in the summaries.
    assert "CoLA dev (" in out and "1043 rows, 1043 used, 0 skipped" in out
    assert "SST-2 train" in out and "67349 rows, 67349 used" in out


def test_layout_quirks_are_read_right(shared_data):
    glue = shared_data / "glue"
    cola = load_glue_split("cola", "dev", glue)  # no header, 4 columns
    assert cola.examples[0] == cola.examples[0].__class__("0", "The sailors rode the breeze clear of the rocks.", None, 1)
    mrpc = load_glue_split("MRPC", "train", glue)  # BOM before "Quality"
    assert mrpc.examples[0].label == 1 and mrpc.examples[0].text_a.startswith("Amrozi accused his brother")
    assert sum(e.label for e in mrpc.examples) == 2474  # 67.4% positive, the known MRPC train balance
    stsb = load_glue_split("sts-b", "dev", glue)
    assert stsb.examples[1].label == pytest.approx(4.75) and stsb.examples[1].guid == "1"
    qnli = load_glue_split("QNLI", "dev", glue)
    assert np.bincount([e.label for e in qnli.examples]).tolist() == [2702, 2761]  # SOURCES.md counts
    test = load_glue_split("CoLA", "test", glue)
    assert test.examples[0].label is None and test.examples[-1].guid == "1062"


def test_unknown_task_and_split():
    with pytest.raises(ConfigError, match="unknown GLUE task 'MNLX'.*CoLA, SST-2"):
        get_glue_dataset("MNLX")
    assert get_glue_dataset("sst2").name == "SST-2" and get_glue_dataset("STS-B").name == "STS-B"
    with pytest.raises(ConfigError, match="MNLI has no split 'dev'; splits: train, dev_matched"):
        load_glue_split("MNLI", "dev", "/nonexistent")


def test_missing_folder_names_the_fix(tmp_path):
    with pytest.raises(DataError, match="no dev.tsv in .* pass the folder holding the RTE TSVs"):
        load_glue_split("RTE", "dev", tmp_path)


def test_header_missing_a_column_is_an_error(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("index\tsentence1\tlabel\n0\tA man.\tentailment\n")
    with pytest.raises(DataError, match=r"dev.tsv, line 1: the header has no text_b column 'sentence2'"):
        read_glue_tsv("RTE", path)


def test_headerless_file_with_too_few_columns_is_an_error(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("gj04\t1\tThe sailors rode.\n" * 3)  # CoLA without its empty third column
    with pytest.raises(DataError, match=r"none of the 3 rows .* line 1: malformed line: 3 fields, missing text_a \(column 3\)"):
        read_glue_tsv("CoLA", path)


def test_malformed_rows_are_skipped_and_counted(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text('sentence\tlabel\nfine "quoted" text \t1\nbroken row without tab\nbad label\t7\nok\t0\n')
    split = read_glue_tsv("SST-2", path)
    assert [e.text_a for e in split.examples] == ['fine "quoted" text ', "ok"]
    assert split.n_rows == 4 and sum(split.skipped.values()) == 2
    summary = split.summary()
    assert "malformed line: 1 fields, missing label (column 'label') (lines [3])" in summary
    assert "label '7' not one of ['0', '1'] (lines [4])" in summary


def test_hf_rows_map_to_the_tsv_label_order():
    # HF MNLI: 0 entailment, 1 neutral, 2 contradiction; the TSV order is contradiction, entailment, neutral.
    rows = [{"premise": "p", "hypothesis": "h", "label": 2, "idx": 7},
            {"premise": "p", "hypothesis": "h", "label": 0, "idx": 8}]
    split = glue_split_from_hf_rows(GLUE_DATASETS["MNLI"], "dev_matched", rows, ["entailment", "neutral", "contradiction"])
    assert [(e.guid, e.label) for e in split.examples] == [("7", 0), ("8", 1)]
    # CoLA: HF names unacceptable/acceptable, TSV labels 0/1.
    cola = glue_split_from_hf_rows(GLUE_DATASETS["CoLA"], "dev", [{"sentence": "s", "label": 1, "idx": 0}],
                                   ["unacceptable", "acceptable"])
    assert cola.examples[0].label == 1 and cola.examples[0].text_b is None
    test = glue_split_from_hf_rows(GLUE_DATASETS["RTE"], "test", [{"sentence1": "a", "sentence2": "b", "label": -1, "idx": 0}],
                                   ["entailment", "not_entailment"], labelled=False)
    assert test.examples[0].label is None


# What each label index means, in our label order: the names of HF `datasets`' glue ClassLabels (MNLI and AX in
# the TSV's order, which differs from HF's). Exported models' id2label come from here.
LABEL_NAMES = {"CoLA": ("unacceptable", "acceptable"), "SST-2": ("negative", "positive"),
               "MRPC": ("not_equivalent", "equivalent"), "STS-B": (), "QQP": ("not_duplicate", "duplicate"),
               "MNLI": ("contradiction", "entailment", "neutral"), "QNLI": ("entailment", "not_entailment"),
               "RTE": ("entailment", "not_entailment"), "WNLI": ("not_entailment", "entailment"),
               "AX": ("contradiction", "entailment", "neutral")}


def test_every_task_names_what_its_labels_mean():
    assert {name: task.label_names for name, task in GLUE_DATASETS.items()} == LABEL_NAMES
    for task in GLUE_DATASETS.values():
        if set(task.labels) - {"0", "1"}:  # labels that are words in the TSV are their own names
            assert task.label_names == task.labels, task.name


def test_label_names_that_do_not_fit_the_labels_are_refused():
    with pytest.raises(ValueError, match="SST-2: label_names .* must name each of the labels"):
        dataclasses.replace(GLUE_DATASETS["SST-2"], label_names=("negative",))
    with pytest.raises(ValueError, match="label_names"):
        dataclasses.replace(GLUE_DATASETS["STS-B"], label_names=("score",))  # regression has no labels to name


def test_hf_rows_through_a_real_datasets_object():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict(
        {"question": ["q1", "q2"], "sentence": ["s1", "s2"], "label": [1, 0], "idx": [0, 1]},
        features=datasets.Features({"question": datasets.Value("string"), "sentence": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["entailment", "not_entailment"]),
                                    "idx": datasets.Value("int32")}))
    split = glue_split_from_hf_rows(GLUE_DATASETS["QNLI"], "dev", ds, ds.features["label"].names)
    assert [(e.text_a, e.text_b, e.label) for e in split.examples] == [("q1", "s1", 1), ("q2", "s2", 0)]


def test_submission_files_round_trip(tmp_path, shared_data):
    mnli = GLUE_DATASETS["MNLI"]
    assert mnli.submission_name("test_matched") == "MNLI-m.tsv" and mnli.submission_name("test_mismatched") == "MNLI-mm.tsv"
    assert GLUE_DATASETS["AX"].submission_name("test") == "AX.tsv"
    path = write_glue_predictions("QNLI", "test", ["0", "1", "2"], [1, 0, 1], tmp_path)
    assert path.name == "QNLI.tsv"
    assert path.read_text() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n2\tnot_entailment\n"
    path = write_glue_predictions("STS-B", "test", ["0", "1"], [4.12345, 0.5], tmp_path)
    assert path.read_text().splitlines()[1:] == ["0\t4.123", "1\t0.500"]
    assert read_glue_predictions("STS-B", path) == {"0": 4.123, "1": 0.5}
    assert [p.name for p in tmp_path.iterdir()] != [] and not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize("name", ["CoLA", "SST-2", "MRPC", "STS-B", "QNLI", "RTE"])
def test_glue_eval_cli_scores_dev_predictions(name, shared_data, tmp_path, capsys):
    dev = shared_data / "glue" / name / "dev.tsv"
    split = read_glue_tsv(name, dev)
    task = split.task
    rng = np.random.default_rng(0)
    labels = np.asarray([e.label for e in split.examples])
    preds = labels + rng.normal(0, 1, len(labels)) if task.is_regression else \
        np.where(rng.random(len(labels)) < 0.7, labels, rng.integers(0, task.num_labels, len(labels)))
    path = write_glue_predictions(task, "dev", [e.guid for e in split.examples], preds, tmp_path)
    assert cli(["--task", name, "--data", str(dev), "--predictions", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = glue_metrics(task, np.round(preds, 3) if task.is_regression else preds, labels)
    assert out["total"] == len(labels)
    for key, value in expected.items():
        assert out[key] == pytest.approx(value)


def test_glue_eval_rejects_mismatched_predictions(shared_data, tmp_path):
    dev = shared_data / "glue" / "RTE" / "dev.tsv"
    path = write_glue_predictions("RTE", "dev", ["0", "1", "9999"], [0, 1, 0], tmp_path)
    with pytest.raises(DataError, match="275 indices without a prediction .* 1 predictions for unknown indices"):
        cli(["--task", "RTE", "--data", str(dev), "--predictions", str(path)])
    path.write_text("index\tprediction\n0\tmaybe\n")
    with pytest.raises(DataError, match="line 2: prediction 'maybe' is not a RTE label"):
        cli(["--task", "RTE", "--data", str(dev), "--predictions", str(path)])
