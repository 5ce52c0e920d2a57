"""The task's options of a launch (everything after `--`), checked once before any rank starts, their syntax and
their values, so that a missing or unknown one is one error, not the task's usage and error printed by every rank
(the files they name are checked by the ranks: they may exist on the nodes alone); and `--config RUN`, a run's saved
settings (its run_config.json) as those options, to run it again or continue it elsewhere."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import widenet_ds
from widenet_ds.errors import ConfigError, LaunchError, RunFolderError
from widenet_ds.launch.options import PROG, LaunchOptions, this_machine
from widenet_ds.run_folder import RunFolder
from widenet_ds.run_folder import read_run_config as read_settings
from widenet_ds.tasks import TASKS
from widenet_ds.training.command_line import build_parser, parse
from widenet_ds.training.run_config import LATEST, RunConfig

CPU_EVAL_EXAMPLES = 500  # SQuAD questions (or GLUE examples) a CPU machine evaluates in about a minute


def _refuse_task_options(task: str, message: str) -> NoReturn:
    raise LaunchError(f"the {task} options after `--`: {message} (`{PROG} {task} --help` lists them)")


def check_task_options(options: LaunchOptions) -> RunConfig:
    """The task's settings, their syntax and values checked (a RunConfig reads no file): the files the options name
    may exist on the nodes alone."""
    task_parser = build_parser(TASKS[options.task].config)
    task_parser.error = lambda message: _refuse_task_options(options.task, message)  # type: ignore[method-assign]
    task_parser.parse_args(list(options.train_args))
    try:
        cfg = parse(TASKS[options.task].config, list(options.train_args))
    except ConfigError as err:
        _refuse_task_options(options.task, str(err))
    if (advice := cpu_advice(cfg, this_machine().has_gpu)) is not None:
        print(f"{PROG}: {advice}", file=sys.stderr, flush=True)
    return cfg


def cpu_advice(cfg: RunConfig, has_gpu: bool) -> str | None:
    """One line for a run on a machine without a GPU, of a task that advises one (`RunConfig.cpu_recipe_flags`),
    whose DeepSpeed JSON is a GPU recipe (bf16/fp16, a batch of more than 32) or that evaluates a whole dev set
    taking minutes there (`RunConfig.dev_set_cost`): the small CPU JSON and --max-eval-examples that fit."""
    recipe_flags = cfg.cpu_recipe_flags()
    if has_gpu or recipe_flags is None:
        return None
    try:
        config = json.loads(Path(cfg.deepspeed_config).read_text())
    except (OSError, ValueError):  # on the nodes only, or broken: the ranks say so
        config = {}
    config = config if isinstance(config, dict) else {}
    big_dev = cfg.dev_set_cost()
    reasons = [f"{key} is on" for key in ("bf16", "fp16") if (config.get(key) or {}).get("enabled")]
    batch = config.get("train_batch_size")
    if isinstance(batch, int) and batch > 32:
        reasons.append(f"a batch of {batch}")
    small = Path(widenet_ds.__file__).resolve().parents[1] / "ds_configs" / cfg.EXAMPLE_DS_CONFIG
    whole_dev = big_dev is not None and cfg.max_eval_examples is None
    fixes = ([f"--deepspeed_config {small} {recipe_flags}"] if reasons and small.is_file() else []) + \
        ([f"--max-eval-examples {CPU_EVAL_EXAMPLES}"] if whole_dev else [])
    if not fixes:
        return None
    what = ([f"{cfg.deepspeed_config} is a GPU recipe ({', '.join(reasons)}: seconds per step on CPU cores)"]
            if reasons else []) + ([f"the whole dev set is evaluated ({big_dev})"] if whole_dev else [])
    return (f"this machine has no CUDA device, and {' and '.join(what)}. For a look on CPU, pass after `--`: "
            f"{' '.join(fixes)} (README.md, \"On a CPU machine\").")


def read_saved_settings(path: Path) -> tuple[Path, dict[str, Any]]:
    """(the run_config.json, its record) that `--config PATH` names: a run folder or the file itself."""
    file = RunFolder(path).run_config if path.is_dir() else path
    try:
        record = read_settings(file)
    except RunFolderError as err:
        raise LaunchError(f"--config {path}: cannot read the run's settings: {err} Or pass the run's options after "
                          f"`--` without --config.") from None
    if "task" not in record and {"hidden_size", "num_layers"} <= set(record):
        raise LaunchError(f"--config {file} is a model config (it holds hidden_size, num_layers, ...), not a run's "
                          f"settings; pass the run folder or its run_config.json to --config, and a model config to "
                          f"the task's --model-config after `--`")
    return file, record


def given_options(task: str, train_args: list[str]) -> dict[str, Any]:
    """The settings the options after `--` give (only those given), as JSON values."""
    task_parser = build_parser(TASKS[task].config)
    for action in task_parser._actions:
        action.required, action.default = False, argparse.SUPPRESS
    task_parser.error = lambda message: _refuse_task_options(task, message)  # type: ignore[method-assign]
    given = vars(task_parser.parse_args(train_args))
    return json.loads(json.dumps(given, default=str))  # Path -> str, tuple -> list: as a record holds them


def read_run_config(task: str, path: Path, train_args: tuple[str, ...] = ()) -> RunConfig:
    """The settings a run saved (its run_config.json, or the run folder holding it), as `task`'s configuration,
    with the options after `--` applied before anything is checked (a later option wins; `--set` adds to the
    saved ones). The run's folder is where the file was found: a run copied or moved elsewhere continues itself;
    paths saved relative are read where the run was started (training/run_config.py, `RunConfig.saved_record`)."""
    file, record = read_saved_settings(path)
    if record.get("task", task) != task:
        raise LaunchError(f"--config {file} holds the settings of a {record['task']} run; launch "
                          f"`{record['task']}`, or pass the run_config.json of a {task} run")
    record, unplaced = TASKS[task].config.saved_record(record, file.parent)
    given = given_options(task, list(train_args))
    record.update({name: record.get(name, []) + value if name == "overrides" and isinstance(record.get(name), list)
                   else value for name, value in given.items()})
    unplaced = [line for line in unplaced if line.split(" ")[0] not in given]
    if unplaced:
        print(f"{PROG}: --config {file}: the saved {', '.join(unplaced)} are relative paths that cannot be placed "
              f"from where the run folder is (no start folder its saved output_dir tells holds them); read from the "
              f"current directory (pass them after `--` to choose)",
              file=sys.stderr, flush=True)
    try:
        cfg = TASKS[task].config.from_record(record)
    except ConfigError as err:
        raise LaunchError(f"--config {file}: {err}") from None
    check_resumes_the_run(cfg, file.parent)
    return cfg


def check_resumes_the_run(cfg: RunConfig, run: Path) -> None:
    """A bare --resume into an output folder other than the --config run's, with nothing to continue there while
    the run has checkpoints, would start a new run from step 1 beside it: refused, with both ways on. (`--resume
    CHECKPOINT --output-dir NEW` continues that checkpoint into NEW: a fork, asked for by name.)"""
    if cfg.resume != LATEST or Path(cfg.output_dir).absolute() == run.absolute():
        return
    saved, there = RunFolder(run).resumable(), cfg.folder.resumable()
    if saved is not None and there is None:
        raise LaunchError(f"--config {run} is a run with {saved}, but --output-dir {cfg.output_dir} holds nothing to "
                          f"resume: --resume there would start a new run from step 1, not continue {run}. To continue "
                          f"the run, drop --output-dir (it continues in {run}); to start a new run in "
                          f"{cfg.output_dir} from its weights, pass --init-from {run} instead of --resume")


def with_saved_settings(options: LaunchOptions) -> LaunchOptions:
    """`--config RUN`: the run's saved settings, then the options after `--`, as the task's options."""
    cfg = read_run_config(options.task, options.run_config, options.train_args)
    return dataclasses.replace(options, train_args=tuple(cfg.to_argv()), run_config=None)
