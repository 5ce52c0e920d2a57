"""The one task registry (widenet_ds/training/registry.py) against everything that lists or tells apart the tasks:
the configurations, tasks and results types it names, the torch-free lists (`results.TASK_RESULTS`,
`run_config.CONFIGS`), `python -m widenet_ds.train`, `widenet-ds launch`, the run folder, the report, and the shell
scripts, which cannot import it: launcher.sh names exactly its tasks, and the one Slurm script names none (it hands
its arguments to the trainer) but documents every one."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import get_type_hints

import pytest

from widenet_ds.launch.options import parser as launch_parser
from widenet_ds.report.metrics import load_runs
from widenet_ds.results import (
    TASK_RESULTS,
    ClassifyResults,
    FinetuneResults,
    PretrainResults,
)
from widenet_ds.run_folder import RunFolder
from widenet_ds.train import usage
from widenet_ds.training import run_config
from widenet_ds.training.command_line import build_parser
from widenet_ds.training.finetuning import FinetuneTask
from widenet_ds.training.registry import TASKS
from widenet_ds.training.sweep import SeedSweep
from widenet_ds.training.task import Task

REPO = Path(__file__).resolve().parents[2]
RESULTS_BEFORE = {kind: REPO / "tests" / "assets" / "results_before" / file for kind, file in (
    (PretrainResults, "pretrain.json"), (FinetuneResults, "finetune.json"), (ClassifyResults, "classify.json"))}


def test_every_row_names_its_configuration_and_task_by_reference():
    for name, spec in TASKS.items():
        assert spec.name == name and spec.config.TASK == name
        assert issubclass(spec.config, run_config.RunConfig) and issubclass(spec.task, Task), name
        # run.py trains one Task per run, and a finetuning benchmark as a sweep of FinetuneTasks over seeds
        assert (spec.benchmark is not None) == (spec.task is FinetuneTask), name
    configs = {vars(cls)["TASK"] for cls in vars(run_config).values()
               if isinstance(cls, type) and issubclass(cls, run_config.RunConfig) and "TASK" in vars(cls)}
    assert configs == set(TASKS), "a RunConfig with a TASK of its own is a row of training/registry.py's TASKS"


def test_the_torch_free_lists_are_the_registry():
    assert run_config.CONFIGS == {name: spec.config for name, spec in TASKS.items()}
    assert TASK_RESULTS == {name: spec.results for name, spec in TASKS.items()}


def test_every_task_writes_the_results_type_it_is_registered_with():
    assert {name: spec.results for name, spec in TASKS.items()} == {
        "pretrain": PretrainResults, "glue": FinetuneResults, "squad": FinetuneResults, "classify": ClassifyResults}
    for name, spec in TASKS.items():
        task = spec.task
        assert get_type_hints(task.finish)["return"] is task.RESULTS, name
        if spec.benchmark is not None:  # the seeds' trainers write SeedResults; the sweep the summary
            assert get_type_hints(SeedSweep.run)["return"] == spec.results | None, name
        else:
            assert task.RESULTS is spec.results, name


def test_the_trainer_and_the_launcher_offer_exactly_the_registry_tasks():
    listed = re.search(r"tasks:\n(.*?)\n\n", usage(), re.S).group(1)
    assert [line.split()[0] for line in listed.splitlines()] == list(TASKS)
    for name, spec in TASKS.items():
        assert spec.description in build_parser(name).description
    choices = next(a.choices for a in launch_parser()._actions if a.dest == "task")
    assert list(choices) == list(TASKS)


@pytest.mark.parametrize("name", TASKS)
def test_the_run_folder_and_the_report_know_each_task(tmp_path, name):
    folder = RunFolder(tmp_path / name)
    folder.write_run_config({"task": name})
    (folder.path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 2.0}) + "\n")
    shutil.copy(RESULTS_BEFORE[TASKS[name].results], folder.results)  # a results.json of its shape
    assert folder.task() == name
    runs, problems = load_runs([folder.path])
    assert not problems and [run.kind for run in runs] == [TASKS[name].results.KIND]


def test_a_task_outside_the_registry_is_no_task(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.write_run_config({"task": "translate"})
    assert folder.task() is None


def test_launcher_sh_launches_and_lists_exactly_the_registry_tasks():
    text = (REPO / "launcher.sh").read_text()
    launched = re.search(r'case "\$cmd" in ([\w|-]+)\) exec "\$WDS" launch "\$cmd"', text).group(1)
    assert launched.split("|") == list(TASKS)
    listed = re.search(r"TASK: ([\w\s]+);", text).group(1)
    assert listed.split() == list(TASKS)


def test_the_one_slurm_script_takes_its_task_from_its_arguments_and_shows_every_task():
    scripts = sorted(p.name for p in (REPO / "slurm").glob("*.sbatch"))
    assert scripts == ["train.sbatch"], "one batch script for every task (its first argument is the task)"
    lines = (REPO / "slurm" / "train.sbatch").read_text().splitlines()
    code = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    named = [name for name in TASKS if re.search(rf"\b{name}\b", code)]
    assert not named, f"the script's commands name tasks {named}: it should pass its first argument on"
    assert 'widenet_ds.train "$TASK" "$@"' in code
    examples = {m.group(1) for line in lines for m in re.finditer(r"slurm/train\.sbatch ([a-z]\w*)", line)}
    assert examples == set(TASKS)
