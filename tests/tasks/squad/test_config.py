"""The SQuAD settings (widenet_ds/tasks/squad/config.py): its scores on the official script's percent scale, the
cost of its dev set on CPU cores, and its files recorded so that the run means the same from any directory."""

from __future__ import annotations

import os
from pathlib import Path

from widenet_ds.tasks.squad.config import SquadConfig


def squad(tmp_path: Path, **fields) -> SquadConfig:
    return SquadConfig(**{"version": "2.0", "data": "hf", "deepspeed_config": tmp_path / "ds.json",
                          "output_dir": tmp_path / "out", "model_config": "widenet-tiny-e4", **fields})


def test_its_scores_are_percentages_and_its_counts_and_thresholds_no_scores():
    assert [SquadConfig.score_scale(m) for m in ("exact_match", "f1", "HasAns_exact", "best_f1")] == ["0-100"] * 4
    assert [SquadConfig.score_scale(m) for m in ("total", "HasAns_total", "best_f1_thresh", "null_threshold")] == \
        [""] * 4


def test_its_dev_set_takes_minutes_on_cpu_cores(tmp_path):
    assert "11,600 windows" in squad(tmp_path).dev_set_cost()


def test_its_files_are_recorded_absolute_and_a_relative_record_is_read_where_the_run_started(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record = squad(tmp_path, train_file="squad/train.json", dev_file="squad/dev.json").record()
    assert (record["train_file"], record["dev_file"]) == (os.path.join(tmp_path, "squad/train.json"),
                                                          os.path.join(tmp_path, "squad/dev.json"))
    # a record of before absolute records: its paths as typed, read against where the run was started
    old = {**record, "output_dir": "runs/sq", "train_file": "squad/train.json", "dev_file": "squad/dev.json"}
    moved = tmp_path / "elsewhere" / "runs" / "sq"
    (tmp_path / "elsewhere" / "squad").mkdir(parents=True)
    for name in ("train.json", "dev.json"):  # a path placed where nothing is would be unplaced
        (tmp_path / "elsewhere" / "squad" / name).write_text("{}")
    placed, unplaced = SquadConfig.saved_record(old, moved)
    assert placed["train_file"] == str(tmp_path / "elsewhere" / "squad" / "train.json") and not unplaced
    assert placed["output_dir"] == str(moved)
