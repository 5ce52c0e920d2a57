"""The settings of finetuning on your own labelled texts: the files a --data folder holds (train.EXT, validation.EXT
or dev.EXT), the flags naming them, the name the run gives the data, and the settings written down and read back
(a local --dataset folder as a path, a hub name as it is). (Each refusal is a row of
tests/integration/test_bad_inputs.py.)"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.launching import REPO
from widenet_ds.tasks.text_classification.config import TextClassificationConfig
from widenet_ds.training.command_line import parse
from widenet_ds.training.environment import check_run

COMMON = ["--deepspeed-config", str(REPO / "ds_configs/finetune_cpu_small.json"), "--model-config", "widenet-tiny-e4"]


def config(tmp_path: Path, *argv: str) -> TextClassificationConfig:
    return parse(TextClassificationConfig, [*COMMON, "--output-dir", str(tmp_path / "out"), *argv])


def test_a_data_folder_holds_the_train_and_the_validation_or_dev_file_and_flags_name_others(tmp_path):
    data = tmp_path / "reviews"
    data.mkdir()
    for name in ("train.jsonl", "dev.csv", "notes.txt", "test.csv"):
        (data / name).write_text("x")
    cfg = config(tmp_path, "--data", str(data))
    check_run(cfg)
    assert (cfg.split_file("train"), cfg.split_file("validation")) == (data / "train.jsonl", data / "dev.csv")
    assert cfg.data_name == "reviews"
    other = tmp_path / "held_out.parquet"
    other.write_text("x")
    cfg = config(tmp_path, "--data", str(data), "--validation-file", str(other))
    check_run(cfg)
    assert (cfg.split_file("train"), cfg.split_file("validation")) == (data / "train.jsonl", other)


def test_the_data_is_named_by_the_dataset_the_folder_or_the_training_file(tmp_path):
    assert config(tmp_path, "--dataset", "stanfordnlp/imdb").data_name == "imdb"
    assert config(tmp_path, "--dataset", "glue@sst2").data_name == "glue-sst2"
    assert config(tmp_path, "--train-file", "a/reviews.csv", "--validation-file", "a/v.csv").data_name == "reviews"
    assert config(tmp_path, "--train-file", "SST-2/train.csv", "--validation-file", "v.csv").data_name == "SST-2"


def test_the_settings_written_down_parse_back_and_a_local_dataset_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    files = config(tmp_path, "--train-file", "t.csv", "--validation-file", "v.tsv", "--text-fields", "q, a",
                   "--label-field", "score", "--regression", "--seeds", "3")
    assert files.text_fields == ("q", "a") and files.regression
    assert parse(TextClassificationConfig, files.to_argv()) == files
    record = files.record()
    assert record["train_file"] == os.path.join(tmp_path, "t.csv") and record["text_fields"] == ["q", "a"]
    assert TextClassificationConfig.from_record(record).text_fields == ("q", "a")  # (a record holds a list)
    assert config(tmp_path, "--dataset", "mine@default").record()["dataset"] == os.path.join(tmp_path, "mine@default")
    assert config(tmp_path, "--dataset", "stanfordnlp/imdb").record()["dataset"] == "stanfordnlp/imdb"  # the hub's
