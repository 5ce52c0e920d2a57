"""The report's readers (widenet_ds/report/metrics.py) over run folders built here: pretraining, image and
finetuning folders with the results.json of each shape as the writers wrote it (tests/assets/results_before/),
old folders without run_config.json, live and damaged files, and paths that are no run at all."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.run_folders import BEFORE, MODEL, finetune_folder, image_folder, pretrain_folder, write_jsonl
from widenet_ds.report.metrics import FinetuneRun, ImageRun, PretrainRun, Problem, load_runs, resolved_init
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks.finetune.results import FinetuneResults


def only_run(paths: list[Path]):
    runs, problems = load_runs(paths)
    assert problems == [] and len(runs) == 1, (runs, problems)
    return runs[0]


def test_a_pretraining_folder_gives_its_series_routing_and_model(tmp_path):
    run = only_run([pretrain_folder(tmp_path / "pre")])
    assert isinstance(run, PretrainRun) and (run.name, run.kind, run.notes) == ("pre", "pretrain", [])
    assert run.series("train/mlm_loss") == ([2, 4], [9.5, 8.25])
    assert run.last("optim/lr") == (4, 2e-4) and run.last("train/sop_loss") is None
    assert run.last_step == 4 and len(run.events) == 1
    assert (run.blocks, run.num_experts) == ([0, 1], 2)
    assert run.expert_load(1) == ([2, 4], [[0.5, 0.5], [0.25, 0.75]])
    # the mean over the blocks of each step's dropped fraction
    assert run.dropped_fraction() == ([2, 4], [0.0625, 0.125])
    assert run.model_summary() == "4 blocks, H 128, MoE E=2 K=1, shared: attention, FFN"


def test_the_held_out_loss_per_branch_count_is_the_last_evaluations(tmp_path):
    """results_before/pretrain.json's final evaluation of ParaFormer's 2 branches, as logged at step 4."""
    final = json.loads((BEFORE / "pretrain.json").read_text())
    run = only_run([pretrain_folder(tmp_path / "pre")])
    assert run.mlm_loss_by_branches() == (4, {1: final["valid_branches_1/mlm_loss"],
                                              2: final["valid_branches_2/mlm_loss"]})
    # an earlier evaluation is not the one shown; a run without branches has none
    lines = (tmp_path / "pre" / "metrics.jsonl").read_text().splitlines()
    early = {"step": 2, "valid_branches_1/mlm_loss": 1.0, "valid_branches_2/mlm_loss": 2.0}
    write_jsonl(tmp_path / "later" / "metrics.jsonl", [early, *lines])
    assert only_run([tmp_path / "later"]).mlm_loss_by_branches()[0] == 4
    write_jsonl(tmp_path / "plain" / "metrics.jsonl", [{"step": 1, "train/mlm_loss": 3.0}])
    assert only_run([tmp_path / "plain"]).mlm_loss_by_branches() is None


def test_a_folder_of_an_older_version_is_told_by_its_files(tmp_path):
    """No run_config.json: metrics alone are pretraining, seed folders finetuning, a results.json naming a
    dataset (or vision_config.json) images."""
    assert isinstance(only_run([pretrain_folder(tmp_path / "pre", task_file=False)]), PretrainRun)
    images = image_folder(tmp_path / "img")
    (images / "run_config.json").unlink()
    (images / "model_config.json").rename(images / "vision_config.json")
    run = only_run([images])
    assert isinstance(run, ImageRun) and run.model_config["patch_size"] == 4 and run.settings is None
    assert run.dataset == "digits"  # from results.json
    finetune = finetune_folder(tmp_path / "ft")
    (finetune / "run_config.json").unlink()
    assert isinstance(only_run([finetune]), FinetuneRun)


def test_a_finished_image_run_reads_results_before_the_types(tmp_path):
    run = only_run([image_folder(tmp_path / "img")])
    assert isinstance(run, ImageRun) and run.finished and run.notes == []
    assert (run.dataset, run.model_name) == ("digits", "paraformer-tiny-3x4")  # results.json wins over run_config
    assert run.accuracy_by_branches() == {1: 0.15, 2: 0.1361111111111111}
    assert run.results.accuracy == 0.1361111111111111 and run.results.parameters == 135370
    assert run.model_summary() == ("2 branches x 2 blocks, H 128, patch 4 of 8 px, MoE E=2 K=1, "
                                   "shared: attention, FFN")


def test_a_running_image_run_shows_its_settings_and_says_why_no_score(tmp_path):
    run = only_run([image_folder(tmp_path / "img", results=None)])
    assert isinstance(run, ImageRun) and not run.finished and run.accuracy_by_branches() == {}
    assert (run.dataset, run.model_name) == ("digits", "widenet-vit-digits")  # from run_config.json
    assert run.notes == ["no results.json yet (running, stopped or failed): test accuracy from the evaluations "
                         "logged so far"]


def test_a_finished_image_run_without_its_log_still_counts(tmp_path):
    folder = image_folder(tmp_path / "img")
    (folder / "metrics.jsonl").unlink()
    run = only_run([folder])
    assert run.finished and run.records == [] and run.last_step is None
    assert run.notes == ["no metrics.jsonl: no curves", "no step logged yet"]


def test_a_finished_finetuning_run_reads_results_before_the_types(tmp_path):
    run = only_run([finetune_folder(tmp_path / "ft")])
    assert isinstance(run, FinetuneRun) and run.finished and run.task == "SST-2" and run.notes == []
    assert run.results.primary_median() == ("dev/acc", 0.5)
    # results.json's final scores, not the seeds' last logged evaluation (which also holds f1)
    assert run.per_seed_metrics() == {1234: {"dev": {"acc": 0.4375}}, 1235: {"dev": {"acc": 0.5625}}}
    assert [s.seed for s in run.seeds] == [1234, 1235]
    assert run.seeds[0].loss() == ([1, 2], [0.75, 0.5])


@pytest.mark.parametrize("loss_key", ["train/loss", "finetune/loss"])
def test_a_running_finetuning_run_shows_each_seeds_last_evaluation(tmp_path, loss_key):
    run = only_run([finetune_folder(tmp_path / "ft", results=False, loss_key=loss_key)])
    assert not run.finished and run.task == "? (no results.json yet)"
    assert run.per_seed_metrics() == {1234: {"dev": {"acc": 0.4375, "f1": 0.21875}},
                                      1235: {"dev": {"acc": 0.5625, "f1": 0.28125}}}
    assert run.seeds[1].loss() == ([1, 2], [0.75, 0.5])  # the loss under either key its trainer logged
    assert run.notes == ["no results.json yet (running, stopped or failed): showing the evaluations logged so far"]


def test_damaged_lines_and_a_live_tail_become_notes(tmp_path):
    folder = pretrain_folder(tmp_path / "pre")
    text = (folder / "metrics.jsonl").read_text()
    (folder / "metrics.jsonl").write_text('{"step": 1, "train/mlm_loss": 10.0}\nnot json\n[1, 2]\n{"no": "step"}\n'
                                          + text + '{"step": 5, "train/mlm')
    run = only_run([folder])
    assert run.live_tail and run.last_step == 4 and run.series("train/mlm_loss")[0] == [1, 2, 4]
    assert run.notes == ["metrics.jsonl: 3 line(s) are not JSON records with a step (line 2, 3, 4); skipped",
                         "metrics.jsonl: the last line is still being written (a live run): read up to the line "
                         "before"]


def test_wrong_typed_and_unreadable_files_are_notes_on_a_run_that_still_shows(tmp_path):
    images = image_folder(tmp_path / "img")
    wrong = {**json.loads((BEFORE / "classify.json").read_text()), "step": "four"}
    (images / "results.json").write_text(json.dumps(wrong))
    (images / "model_config.json").write_text("[1, 2]")
    (images / "run_config.json").write_text(json.dumps({"task": "classify", "dataset": "digits"}))
    run = only_run([images])
    assert isinstance(run, ImageRun) and not run.finished and run.model_config is None
    assert len(run.notes) == 2, run.notes
    assert "results.json: image-classification results: 'step' is 'four', not an integer" in run.notes[0]
    assert run.notes[1] == "model_config.json is not a JSON object"
    finetune = finetune_folder(tmp_path / "ft")
    (finetune / "results.json").write_text('{"task": "SST-2", "median": ')
    (finetune / "seed1235" / "metrics.jsonl").unlink()
    run = only_run([finetune])
    assert not run.finished and [s.seed for s in run.seeds] == [1234]
    assert "results.json (the run's results) is not valid JSON" in run.notes[0]
    assert run.notes[1] == "seed1235/ has no metrics.jsonl"


def test_what_cannot_be_used_is_a_problem_with_the_reason(tmp_path):
    garbled = write_jsonl(tmp_path / "garbled" / "metrics.jsonl", ["not json", "\x00\x01"]).parent
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "model_config.json").write_text(json.dumps(MODEL))
    broken = tmp_path / "broken"  # a results.json that says nothing: no task to tell the kind by
    broken.mkdir()
    (broken / "results.json").write_text("{")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    dead_seeds = tmp_path / "dead_seeds"
    (dead_seeds / "seed1").mkdir(parents=True)
    paths = [garbled, config_only, broken, a_file, empty, dead_seeds, tmp_path / "missing"]
    runs, problems = load_runs(paths)
    assert runs == [] and all(isinstance(p, Problem) for p in problems)
    why = {p.path.name: p.message for p in problems}
    assert why["garbled"] == "metrics.jsonl holds no readable record (2 bad line(s))"
    assert why["config_only"].startswith("a run folder without metrics.jsonl")
    assert "results.json (the run's results) is not valid JSON" in why["broken"]
    assert why["notes.txt"] == "is not a folder (pass a run's output folder)"
    assert why["empty"].startswith("not a run folder: no metrics.jsonl")
    assert why["dead_seeds"] == ("no results.json yet (running, stopped or failed): showing the evaluations logged "
                                 "so far; seed1/ has no metrics.jsonl")
    assert why["missing"] == "does not exist"
    # the paths that are no folder of runs first, as given; then the folders that did not read
    assert [str(p) for p in problems[:4]] == [f"{a_file}: is not a folder (pass a run's output folder)",
                                              f"{empty}: {why['empty']}", f"{tmp_path / 'missing'}: does not exist",
                                              f"{garbled}: {why['garbled']}"]


def test_a_folder_of_runs_stands_for_them_and_each_run_is_read_once(tmp_path):
    study = tmp_path / "study"
    pretrain_folder(study / "a" / "run")
    finetune_folder(study / "b" / "run")
    (study / "notes").mkdir()  # not a run: left out, not a problem
    runs, problems = load_runs([study / "a", study / "b", study / "a" / "run", study / "b" / ".." / "a"])
    assert problems == []
    # a/ and b/ hold one run each; a/run given three ways is one run, named apart from b/run
    assert [(r.name, r.kind) for r in runs] == [("a/run", "pretrain"), ("b/run", "finetune")]
    assert runs[0].notes == [f"given 3 times ({study / 'a' / 'run'}, {study / 'a' / 'run'}, "
                             f"{study / 'b' / '..' / 'a' / 'run'}): shown once"]
    assert runs[1].notes == []


def test_a_finetuning_runs_start_is_its_checkpoint_resolved(tmp_path):
    """results.json's init as runs of this version write it (absolute), as older ones did (as typed: relative, read
    through run_config.json's absolute init_from), and a random start's preset."""
    folder = RunFolder(tmp_path / "ft")
    folder.path.mkdir()
    results = FinetuneResults("SST-2", "runs/pre", 4, 1, {}, [])
    assert resolved_init(folder, results) == "runs/pre"  # nothing tells where it was relative to
    folder.write_run_config({"task": "glue", "init_from": str(tmp_path / "runs" / "pre")})
    assert resolved_init(folder, results) == str(tmp_path / "runs" / "pre")
    assert resolved_init(folder, replace(results, init=f"{tmp_path}/runs/../runs/pre/checkpoints/step4")) == \
        str(tmp_path / "runs" / "pre" / "checkpoints" / "step4")
    assert resolved_init(folder, replace(results, init="preset:widenet-tiny-e4")) == "preset:widenet-tiny-e4"
    assert resolved_init(folder, None) is None
