"""The one table of training tasks (widenet_ds/tasks/): torch-free, so that the launcher's task list and the report
read it without torch; each row names its settings and results by reference; every tool that lists or tells apart
the tasks reads it (`python -m widenet_ds.train`, `widenet-ds launch`, `widenet-ds TASK`, the run folder's task, the
report); and the shell scripts, which cannot import it, name none: launcher.sh hands a task's name to widenet-ds, the
one Slurm script hands its arguments to the trainer. A new task is its package and its row: no list of task names
elsewhere to keep."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from widenet_ds import tasks
from widenet_ds.cli import SUBCOMMANDS
from widenet_ds.cli import main as widenet_ds
from widenet_ds.report.metrics import load_runs
from widenet_ds.run_folder import RunFolder
from widenet_ds.tasks import TASKS, task_of
from widenet_ds.train import usage
from widenet_ds.training import run_config
from widenet_ds.training.command_line import build_parser

REPO = Path(__file__).resolve().parents[1]
RESULTS_BEFORE = REPO / "tests" / "assets" / "results_before"
# a results.json of each kind of results (a row's results type)
EXAMPLE_RESULTS = {"pretrain": "pretrain.json", "finetune": "finetune.json", "classify": "classify.json"}

# Run with torch unimportable: a meta-path finder first in line that refuses it.
WITHOUT_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "deepspeed"):
            raise ImportError(f"{name} is not importable here")

sys.meta_path.insert(0, NoTorch())
"""


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH + code], capture_output=True, text=True, cwd=REPO)


def test_the_table_the_launchers_task_list_and_the_report_import_no_torch():
    listed = run_without_torch("""
from widenet_ds.launch.options import parser
from widenet_ds.report.cli import cli
from widenet_ds.tasks import TASKS
choices = next(a.choices for a in parser()._actions if a.dest == "task")
print(" ".join(choices), "|", " ".join(TASKS))
""")
    assert listed.returncode == 0, listed.stderr
    choices, _, names = listed.stdout.strip().partition(" | ")
    assert choices.split() == names.split() == list(TASKS)
    # the finder does refuse torch: the trainer needs it
    refused = run_without_torch("import widenet_ds.training.trainer")
    assert refused.returncode == 1 and "torch is not importable here" in refused.stderr, refused.stderr


def test_every_row_names_its_settings_and_results_by_reference():
    for name, spec in TASKS.items():
        assert spec.name == name and spec.config.TASK == name
        assert issubclass(spec.config, run_config.RunConfig) and spec.results.KIND, name
        assert spec.description in build_parser(spec.config).description
    modules = [importlib.import_module(m.name) for m in pkgutil.walk_packages(tasks.__path__, "widenet_ds.tasks.")
               if m.name.endswith(".config")]  # each task's settings (torch-free)
    configs = {vars(cls)["TASK"] for module in modules for cls in vars(module).values()
               if isinstance(cls, type) and issubclass(cls, run_config.RunConfig) and "TASK" in vars(cls)}
    assert configs == set(TASKS), "a RunConfig with a TASK of its own is a row of widenet_ds/tasks/'s TASKS"


def test_the_trainers_help_lists_exactly_the_tasks_of_the_table():
    rows = re.search(r"tasks:\n(.*?)\n\n", usage(), re.S).group(1).splitlines()
    assert [row.split()[0] for row in rows] == list(TASKS)
    assert all(spec.description in row for spec, row in zip(TASKS.values(), rows))


@pytest.mark.parametrize("name", TASKS)
def test_the_run_folder_and_the_report_know_each_task(tmp_path, name):
    folder = RunFolder(tmp_path / name)
    folder.write_run_config({"task": name})
    (folder.path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 2.0}) + "\n")
    shutil.copy(RESULTS_BEFORE / EXAMPLE_RESULTS[TASKS[name].results.KIND], folder.results)  # one of its shape
    assert task_of(folder) == name
    runs, problems = load_runs([folder.path])
    assert not problems and [run.kind for run in runs] == [TASKS[name].results.KIND]


def test_a_task_outside_the_table_is_no_task(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.write_run_config({"task": "translate"})
    assert folder.recorded_task() == "translate" and task_of(folder) is None


def test_folders_of_before_run_config_named_the_task_are_told_by_their_files(tmp_path):
    assert task_of(RunFolder(tmp_path / "nothing")) is None
    old = RunFolder(tmp_path / "old")
    (old.path / "seed3").mkdir(parents=True)
    assert task_of(old) == "glue"  # seed folders: finetuning
    images = RunFolder(tmp_path / "images")  # image results name a dataset
    images.path.mkdir()
    shutil.copy(RESULTS_BEFORE / "classify.json", images.results)
    assert task_of(images) == "classify"
    text = RunFolder(tmp_path / "text")
    text.path.mkdir()
    text.metrics.write_text('{"step": 1}\n')
    assert task_of(text) == "pretrain"
    text.run_config.write_text("{broken")  # unreadable: told by the files too
    assert task_of(text) == "pretrain"


def test_launcher_sh_names_no_task_and_widenet_ds_launches_every_task_by_its_name(capsys):
    """launcher.sh hands a task's name to `widenet-ds`, where it is `widenet-ds launch TASK` (here refused by the
    launcher's own check of its options, before anything starts)."""
    text = (REPO / "launcher.sh").read_text()
    lines = text[text.rindex("EOF_USAGE"):].splitlines()  # its commands (the usage's words are no dispatch)
    code = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    aliases = {"classify", "glue", "squad"}  # what its older names `vision`, `finetune [--squad]` stand for
    named = [name for name in TASKS if name not in aliases and re.search(rf"(?<![\w-]){name}(?![\w-])", code)]
    assert not named, f"launcher.sh names the tasks {named}: it should hand them to widenet-ds"
    assert not set(TASKS) & set(SUBCOMMANDS), "a task's name is its command: no other command may have it"
    for name in TASKS:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:  # argparse's exit, as the launch options are refused
            widenet_ds([name, "--num-ranks", "0", "--", "--x"])
        assert exited.value.code == 2, name
        assert "widenet-ds launch: error: argument --num-ranks/--num-gpus: '0' must be a whole number >= 1" in \
            capsys.readouterr().err, name


def test_the_one_slurm_script_takes_its_task_from_its_arguments():
    scripts = sorted(p.name for p in (REPO / "slurm").glob("*.sbatch"))
    assert scripts == ["train.sbatch"], "one batch script for every task (its first argument is the task)"
    lines = (REPO / "slurm" / "train.sbatch").read_text().splitlines()
    code = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    named = [name for name in TASKS if re.search(rf"\b{name}\b", code)]
    assert not named, f"the script's commands name tasks {named}: it should pass its first argument on"
    assert 'widenet_ds.train "$TASK" "$@"' in code
    # its examples (a few tasks: any task runs the same way) name tasks of the table
    examples = {m.group(1) for line in lines for m in re.finditer(r"slurm/train\.sbatch ([a-z][\w-]*)", line)}
    assert examples and examples <= set(TASKS), examples
