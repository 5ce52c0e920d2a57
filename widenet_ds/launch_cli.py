"""`widenet-ds launch TASK [launch options] -- [options of the task]`, and `launch_config(cfg)` for Python callers
that build a run configuration instead of its command line. The task's options are checked once here, their syntax
and their values, before any rank starts, so a missing or unknown one is one error, not the task's usage and error
printed by every rank (the files they name are checked by the ranks: they may exist on the nodes alone); then
widenet_ds/runtime/launch.py plans and starts the ranks. This sits above both: the trainer's parser (training/) is a
layer above the launcher (runtime/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NoReturn

from widenet_ds.errors import ConfigError, LaunchError
from widenet_ds.run_folder import RunFolder, read_run_config as read_settings
from widenet_ds.runtime.launch import TRAIN_MODULE, LaunchOptions, launch, parse_launch_args
from widenet_ds.training.command_line import CONFIGS, build_parser, parse
from widenet_ds.training.run_config import RunConfig


def check_task_options(options: LaunchOptions) -> None:
    """The syntax and the values (a RunConfig reads no file): the files the options name may exist on the nodes
    alone."""
    task_parser = build_parser(options.task)

    def refuse(message: str) -> NoReturn:
        raise LaunchError(f"the {options.task} options after `--`: {message} (`python -m {TRAIN_MODULE} "
                          f"{options.task} --help` lists them)")

    task_parser.error = refuse  # type: ignore[method-assign]
    if {"-h", "--help"} & set(options.train_args):  # asked for: every rank prints it (tests count ranks so)
        return
    task_parser.parse_args(list(options.train_args))
    try:
        parse(options.task, list(options.train_args))
    except ConfigError as err:
        refuse(str(err))


def launch_config(cfg: RunConfig, **launch_options: Any) -> int:
    """Train `cfg` on N ranks: `widenet-ds launch` with the command line `cfg.to_argv()`. `launch_options`:
    LaunchOptions' fields but the task and its options (ranks_per_node, hostfile, ...)."""
    return launch(LaunchOptions(cfg.TASK, tuple(cfg.to_argv()), **launch_options), check_task_options)


def read_run_config(task: str, path: Path) -> RunConfig:
    """The settings a run saved (its run_config.json, or the run folder holding it), as `task`'s configuration."""
    try:
        record = RunFolder(path).read_run_config() if path.is_dir() else read_settings(path)
    except (OSError, ValueError) as err:
        raise LaunchError(f"--config {path}: cannot read the run's settings ({err}); pass a run folder or its "
                          f"run_config.json") from None
    if record.get("task", task) != task:
        raise LaunchError(f"--config {path} holds the settings of a {record['task']} run; launch "
                          f"`{record['task']}`, or pass the run_config.json of a {task} run")
    try:
        return CONFIGS[task].from_record(record)
    except ConfigError as err:
        raise LaunchError(f"--config {path}: {err}") from None


def cli(argv: list[str]) -> int:
    options = parse_launch_args(argv)
    if options.run_config is not None:
        saved = read_run_config(options.task, options.run_config).to_argv()
        options = dataclasses.replace(options, train_args=(*saved, *options.train_args), run_config=None)
    return launch(options, check_task_options)
