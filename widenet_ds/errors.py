"""User-facing errors. Each message names the problem and the fix."""

from __future__ import annotations

import sys
from typing import Callable


class WideNetError(Exception):
    """Base class of every error caused by user input (configs, data, checkpoints, launch)."""


class ConfigError(WideNetError, ValueError):
    """A model, training or DeepSpeed configuration that cannot work."""


class DataError(WideNetError, ValueError):
    """Input data that is missing, malformed or does not match the run."""


class CheckpointError(WideNetError, ValueError):
    """A checkpoint or exported folder that is missing, partial or of another model."""


class LaunchError(WideNetError, RuntimeError):
    """A launch environment (hostfile, Slurm, MPI, world size) that cannot run the job."""


class RunFolderError(WideNetError, ValueError):
    """A run-folder file that exists but cannot be read as what it should be."""


def mark_same_on_every_rank(err: BaseException) -> BaseException:
    """Tag an error raised alike on every rank (they read the same inputs, or agreed on it): printed once, by
    rank 0 (widenet_ds/distributed/console.py)."""
    err.same_on_every_rank = True  # type: ignore[attr-defined]
    return err


def problems_text(problems: list[str], what: str) -> str:
    """One message naming every problem found (litgpt's `validate_args` style), so a user fixes all of them
    in one go."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems with {what}:\n  - " + "\n  - ".join(problems)


def raise_config_problems(problems: list[str], what: str) -> None:
    """One ConfigError naming every problem found; nothing when the list is empty."""
    if problems:
        raise ConfigError(problems_text(problems, what))


def print_error(prog: str, err: BaseException) -> None:
    print(f"{prog}: error: {err}", file=sys.stderr)


def exit_status(prog: str, command: Callable[[], int | None],
                report: Callable[[str, BaseException], None] = print_error) -> int:
    """Run a command-line command: its exit status, or 2 after one `prog: error: ...` line on stderr (`report`:
    where several ranks run it, once for all of them) when the input was at fault (a WideNetError; no
    traceback: the message names the problem and the fix)."""
    try:
        return int(command() or 0)
    except WideNetError as err:
        report(prog, err)
        return 2
