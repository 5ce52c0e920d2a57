"""The run folder: one reader of metrics.jsonl (live folders included), the files of a run named once, and
the task its settings record, for folders of this version and of older ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from widenet_ds.errors import RunFolderError
from widenet_ds.run_folder import RunFolder, keep_records_up_to, read_metrics
from widenet_ds.tasks.classify.results import ClassifyResults

# an image run's results.json as the writers wrote it before the typed results
IMAGE_RESULTS = Path(__file__).resolve().parent / "assets" / "results_before" / "classify.json"


def test_records_events_and_a_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 2.5}\n{"time": 1.0, "event": "data read"}\n'
                    '{"step": 1, "event": "saved"}\n{"step": 2, "train/loss": 2.25}\n{"step": 3, "tra')
    live = read_metrics(path, live=True)
    assert live.series("train/loss") == {1: 2.5, 2: 2.25} and live.live_tail and not live.bad_lines
    assert [e["event"] for e in live.events] == ["data read", "saved"]
    with pytest.raises(RunFolderError, match=r"metrics.jsonl, line 5: not a metrics record"):
        read_metrics(path)  # a finished run's file must be whole
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    assert read_metrics(path, live=True).bad_lines == [2]


def test_a_resumed_run_keeps_the_records_up_to_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"time": 0, "event": "run"}\n{"step": 1}\n{"step": 2}\n{"step": 3, "event": "x"}\n')
    keep_records_up_to(path, 2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"time": 0, "event": "run"}, {"step": 1}, {"step": 2}]


def test_what_a_folder_holds_and_the_task_it_records(tmp_path):
    folder = RunFolder(tmp_path / "run")
    assert folder.holds() == [] and folder.recorded_task() is None
    folder.write_run_config({"task": "classify", "seed": 1})
    folder.write_results(ClassifyResults.from_json(json.loads(IMAGE_RESULTS.read_text()), str(IMAGE_RESULTS)))
    assert folder.holds() == ["run_config.json", "results.json"] and folder.recorded_task() == "classify"
    assert folder.read_results(ClassifyResults).dataset == "digits"
    old = RunFolder(tmp_path / "old")
    (old.path / "seed3").mkdir(parents=True)
    assert old.recorded_task() is None and old.holds() == ["seed3/"] and [s for s, _ in old.seeds()] == [3]
    text = RunFolder(tmp_path / "text")
    (text.checkpoints / "step1").mkdir(parents=True)
    assert text.holds() == ["checkpoints/"]
    text.run_config.write_text("{broken")
    assert text.recorded_task() is None  # (the task is then told by the files: widenet_ds/tasks/)
    with pytest.raises(RunFolderError, match=r"run_config.json \(the run's settings\) is not valid JSON"):
        text.read_run_config()


def test_run_config_is_written_with_its_version_and_read_as_the_settings(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_run_config({"task": "pretrain", "seed": 1})
    assert json.loads(folder.run_config.read_text()) == {"format_version": 2, "task": "pretrain", "seed": 1}
    assert folder.read_run_config() == {"task": "pretrain", "seed": 1}  # the settings, as RunConfig.record() gave
    # written before the version was recorded (version 1): the same settings
    folder.run_config.write_text(json.dumps({"task": "pretrain", "seed": 1}))
    assert folder.read_run_config() == {"task": "pretrain", "seed": 1} and folder.recorded_task() == "pretrain"
    folder.run_config.write_text(json.dumps({"format_version": 3, "task": "pretrain"}))
    with pytest.raises(RunFolderError, match=r"run_config.json \(the run's settings\) is of format version 3, newer"):
        folder.read_run_config()


@pytest.mark.parametrize("options, task, settings", [
    ({"task": "SST-2", "predict_test": True}, "glue", {"glue_task": "SST-2", "predict_test": True}),
    ({"version": "2.0", "train_file": None, "dev_file": None, "doc_stride": 128}, "squad",
     {"version": "2.0", "train_file": None, "dev_file": None, "doc_stride": 128}),
])
def test_finetunings_run_config_of_before_one_task_name_per_run(tmp_path, options, task, settings):
    """Only finetuning wrote run_config.json then, its task an object of the task's options."""
    folder = RunFolder(tmp_path)
    folder.run_config.write_text(json.dumps({"task": options, "data": "glue/SST-2", "preset": "widenet-tiny-e4"}))
    assert folder.recorded_task() == task
    assert folder.read_run_config() == {"task": task, **settings, "data": "glue/SST-2", "preset": "widenet-tiny-e4"}
