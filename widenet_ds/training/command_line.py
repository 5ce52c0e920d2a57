"""The trainers' command lines, built in one place from the run configurations' fields, and the table of every
flag (docs/flags.md)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from widenet_ds.errors import ConfigError
from widenet_ds.training.flags import add_flags, values
from widenet_ds.training.run_config import RunConfig


def build_parser(cls: type[RunConfig], prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of the task `cls` configures: the trainers' one ArgumentParser construction site; `prog`: the
    entry as it was started (default `python -m widenet_ds.train TASK`)."""
    task = cls.TASK
    parser = argparse.ArgumentParser(
        prog=prog or f"python -m widenet_ds.train {task}",
        description=f"{cls.DESCRIPTION} Start it with `widenet-ds launch {task}`, the `deepspeed` launcher "
                    f"(--module widenet_ds.train {task}), srun or mpiexec. Batch sizes, learning rate, schedule, "
                    f"precision and ZeRO stage come from the DeepSpeed JSON only; flags: docs/flags.md.")
    add_flags(parser, cls)
    return parser


def parse(cls: type[RunConfig], argv: list[str] | None = None, prog: str | None = None) -> RunConfig:
    """The validated run configuration `cls` from its command line. A command line argparse refuses is a
    ConfigError (each rank of a run parses the same one: printed once, not argparse's usage and error per rank)."""
    parser = build_parser(cls, prog)

    def refuse(message: str) -> NoReturn:
        raise ConfigError(f"{message} (`{parser.prog} --help` lists the options)")

    parser.error = refuse  # type: ignore[method-assign]
    return cls(**values(parser.parse_args(argv), cls))


def _shown_default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "switch"
    if action.default is None or action.default == []:
        shown = "-"
    elif isinstance(action.default, tuple):
        shown = f"`{','.join(map(str, action.default))}`"
    else:
        shown = f"`{action.default}`"
    return shown + (f" (bare: `{action.const}`)" if action.nargs == "?" else "")


def flags_table(configs: Sequence[type[RunConfig]]) -> str:
    """docs/flags.md's table: every flag of the tasks `configs` configure, the tasks that take it, its default and its
    one meaning."""
    rows: dict[str, dict] = {}
    for cls in configs:
        task = cls.TASK
        for action in build_parser(cls)._actions:
            if not action.option_strings or action.dest == "help":
                continue
            name = ", ".join(f"`{o}`" for o in action.option_strings)
            row = rows.setdefault(name, {"tasks": [], "defaults": {}, "meaning": set()})
            row["tasks"].append(task)
            row["defaults"][task] = _shown_default(action)
            row["meaning"].add(" ".join((action.help or "").split()).replace("%%", "%").replace("|", "/"))
    lines = ["| flag | tasks | default | meaning |", "| --- | --- | --- | --- |"]
    for name, row in rows.items():
        defaults = set(row["defaults"].values())
        default = defaults.pop() if len(defaults) == 1 else "; ".join(f"{t}: {d}" for t, d in row["defaults"].items())
        tasks = "all" if len(row["tasks"]) == len(configs) else ", ".join(row["tasks"])
        assert len(row["meaning"]) == 1, f"{name} has several meanings: {row['meaning']}"
        lines.append(f"| {name} | {tasks} | {default} | {row['meaning'].pop()} |")
    return "\n".join(lines) + "\n"
