"""The `widenet-ds` console command: one entry, subcommands implemented where their concept lives. The one
dispatcher: `python -m widenet_ds.train` and the pretrain/ and finetune/ scripts run its `train` command."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import sys
from collections.abc import Callable

from widenet_ds.distributed.console import report_error
from widenet_ds.engine.quiet import quiet_third_party
from widenet_ds.errors import exit_status
from widenet_ds.fs.disk_space import DiskFullError, full_disk_message
from widenet_ds.tasks import TASKS

# name -> (module:function, one-line help). Imported lazily so `widenet-ds params` does not pay for
# the data pipeline's imports and vice versa.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("widenet_ds.train:cli", f"one rank of a training task ({', '.join(TASKS)}): what `launch`, deepspeed "
                                      f"(--module widenet_ds.train), srun and mpiexec start"),
    "model-config": ("widenet_ds.model.config:cli", "write a model-config JSON from a preset plus overrides"),
    "params": ("widenet_ds.commands.params:cli", "parameter counts of the presets, text and image"),
    "train-tokenizer": ("widenet_ds.data.tokenizer:cli", "train a WordPiece vocabulary over text sources"),
    "prepare-data": ("widenet_ds.data.prepare:cli", "build sharded MLM+SOP pretraining examples"),
    "verify-data": ("widenet_ds.data.verify:cli", "check every shard of a prepared data folder against its checksums"),
    "verify": ("widenet_ds.commands.verify:cli", "check every file of a checkpoint or exported folder against its "
                                                 "recorded size and SHA-256"),
    "squad-eval": ("widenet_ds.tasks.squad.metrics:cli", "official SQuAD v1.1/v2.0 scores of a predictions file"),
    "glue-eval": ("widenet_ds.tasks.glue.metrics:cli", "GLUE metrics of a predictions file"),
    "convert": ("widenet_ds.commands.convert:cli", "convert checkpoints: to-folder, reshard, to-hf, from-hf, "
                                                   "to-albert, from-albert, to-hf-vit, to-shape-free"),
    "branches": ("widenet_ds.commands.branches:cli", "ParaFormer branches of a checkpoint folder: compress to "
                                                     "the first K, expand to M"),
    "report": ("widenet_ds.report.cli:cli", "HTML page with plots of pretraining/image/finetuning run folders"),
    "launch": ("widenet_ds.launch.launcher:cli", "train on N ranks: deepspeed --module widenet_ds.train TASK (CPU rank "
                                                 "count, hostfile check, signal relay)"),
    "demo": ("widenet_ds.commands.demo:demo_cli", "pretrain widenet-tiny-e4 on 2 CPU ranks, finetune it on SST-2, report"),
    "vision-demo": ("widenet_ds.commands.demo:vision_demo_cli", "train widenet-vit-tiny on Fashion-MNIST on 2 CPU ranks"),
}

# A command's form run by another function: `launch --dry-run` plans the job in this process (it builds the model on
# the meta device, with DeepSpeed), where `launch` itself never imports DeepSpeed; `launch --preflight` starts the
# preflight's ranks in place of the job's.
FORMS: dict[tuple[str, str], str] = {("launch", "--dry-run"): "widenet_ds.launch.dry_run:cli",
                                     ("launch", "--preflight"): "widenet_ds.launch.preflight:cli"}

# Commands that never import DeepSpeed (start fast, print nothing of DeepSpeed's).
# The launchers start DeepSpeed in the ranks only: a bad launch option fails at once.
LIGHT_COMMANDS = {"squad-eval", "glue-eval", "model-config", "prepare-data", "train-tokenizer", "verify-data",
                  "report", "launch", "launch --preflight", "demo", "vision-demo"}


def _usage() -> str:
    lines = ["usage: widenet-ds <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += [f"  {'TASK':<16} `launch TASK`: a task's name is the command that launches it ({', '.join(TASKS)})",
              "", "`widenet-ds <command> --help` shows the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The `widenet-ds` console command."""
    return quiet_on_closed_pipe(lambda: dispatch(argv))


def quiet_on_closed_pipe(command: Callable[[], int]) -> int:
    """`command`'s exit status; where the reader of its output has gone (`widenet-ds --help | head`), no
    BrokenPipeError traceback: as Python's documentation advises (library/signal.html, "Note on SIGPIPE"), the rest
    of the output goes to /dev/null, and the exit status is 1."""
    try:
        try:
            return command()
        finally:
            sys.stdout.flush()  # (inside: the pipe's error is raised here, not at the interpreter's exit)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def dispatch(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name in TASKS:  # every task of the table, with no list of them anywhere else (launcher.sh hands them here)
        name, rest = "launch", argv
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, [*SUBCOMMANDS, *TASKS], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        print(f"widenet-ds: unknown command {name!r}.{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    own = rest[:rest.index("--")] if "--" in rest else rest
    for (command, flag), target in FORMS.items():
        if name == command and flag in own:
            return run_command(f"{name} {flag}", rest, f"widenet-ds {name}", entry=target)
    return run_command(name, rest, f"widenet-ds {name}")


def run_command(name: str, argv: list[str], prog: str, func: Callable[[list[str]], int | None] | None = None,
                entry: str | None = None) -> int:
    """Run one command (`func`: in place of the registered function, e.g. the entry under another name; `entry`:
    the "module:function" of a command's form, FORMS): its exit
    status, or 2 after one `prog: error: ...` line for an error of the input (a full disk among them), printed
    once for all ranks of a training run (distributed/console.py)."""
    if name not in LIGHT_COMMANDS:
        quiet_third_party()
        # DeepSpeed logs to stdout from import on; machine-readable output (--json) must stay clean.
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed  # noqa: F401
    if func is None:
        module_name, func_name = (entry or SUBCOMMANDS[name][0]).split(":")
        func = getattr(importlib.import_module(module_name), func_name)
    return exit_status(prog, lambda: _full_disk_as_error(func, argv), report=report_error)


def _full_disk_as_error(func, argv: list[str]) -> int | None:
    try:
        return func(argv)
    except OSError as err:
        message = full_disk_message(err)
        if message is None:
            raise
        raise DiskFullError(message) from None


if __name__ == "__main__":
    sys.exit(main())
