"""`widenet-ds launch TASK [launch options] -- [options of the task]`: the task's options are parsed once here,
before any rank starts, so a missing or unknown one is one error, not the task's usage and error printed by every
rank; then widenet_ds/runtime/launch.py plans and starts the ranks. This sits above both: the trainer's parser
(training/) is a layer above the launcher (runtime/)."""

from __future__ import annotations

from typing import NoReturn

from widenet_ds.errors import LaunchError
from widenet_ds.runtime.launch import TRAIN_MODULE, LaunchOptions, launch, parse_launch_args
from widenet_ds.training.command_line import build_parser


def check_task_options(options: LaunchOptions) -> None:
    """Only the syntax: the files the options name may exist on the nodes alone."""
    task_parser = build_parser(options.task)

    def refuse(message: str) -> NoReturn:
        raise LaunchError(f"the {options.task} options after `--`: {message} (`python -m {TRAIN_MODULE} "
                          f"{options.task} --help` lists them)")

    task_parser.error = refuse  # type: ignore[method-assign]
    if not {"-h", "--help"} & set(options.train_args):  # asked for: every rank prints it (tests count ranks so)
        task_parser.parse_args(list(options.train_args))


def cli(argv: list[str]) -> int:
    return launch(parse_launch_args(argv), check_task_options)
