"""The environment that reaches the ranks of a multi-node launch.

DeepSpeed's multi-node runners (pdsh over ssh, and the MPI ones) start every node's ranks, the first node's too,
in a fresh login environment: they carry only variables named PYTHON*, NCCL*, UCX*, MV2* and MLFLOW*, plus the
lines of a `.deepspeed_env` file (in ~ or the current folder; `DS_ENV_FILE` renames it). So what `widenet-ds
launch` sets for the ranks (the OMP thread share, DS_ACCELERATOR=cpu, the allocator) and what the user exported
(OMP_NUM_THREADS, TORCH_EXTENSIONS_DIR, ...) never arrived: seen on a 2-node test cluster, where both ranks ran
with every core's threads and without the allocator. `runner_env_file` writes them into one such file for the
runner, after the user's own `.deepspeed_env` lines are kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# Set by the user, read by the ranks; DeepSpeed's runner does not forward them by itself.
USER_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR", "LD_PRELOAD",
             "GLIBC_TUNABLES", "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD")
USER_PREFIXES = ("WIDENET_",)
DS_ENV_NAME = ".deepspeed_env"  # DeepSpeed's default name (runner.DEEPSPEED_ENVIRONMENT_NAME)


def ranks_env(environ: Mapping[str, str], env_changes: Mapping[str, str]) -> dict[str, str]:
    """The variables every node's ranks must get: the user's among USER_VARS/USER_PREFIXES, then the launch's own
    changes (which only fill in what the user left unset). PYTHONPATH travels by itself (PYTHON*)."""
    chosen = {name: value for name, value in environ.items()
              if name in USER_VARS or name.startswith(USER_PREFIXES)}
    chosen.update({name: value for name, value in env_changes.items() if not name.startswith("PYTHON")})
    return chosen


def runner_env_file(variables: Mapping[str, str], folder: Path, environ: Mapping[str, str] = os.environ,
                    cwd: Path | None = None) -> dict[str, str]:
    """Write `variables` into a DeepSpeed env file in `folder`; the user's own ~/.deepspeed_env and
    ./.deepspeed_env lines (read by DeepSpeed in that order) follow, so that they still win. Returns the
    runner's environment change that points DeepSpeed at it (an absolute DS_ENV_FILE replaces both places)."""
    name = environ.get("DS_ENV_FILE", DS_ENV_NAME)
    lines = [f"{key}={value}\n" for key, value in variables.items()]
    for place in (Path.home(), cwd or Path.cwd()):
        theirs = place / name
        if theirs.is_file():
            lines += [line + "\n" for line in theirs.read_text().splitlines() if "=" in line]
    path = Path(folder) / DS_ENV_NAME
    path.write_text("".join(lines))
    return {"DS_ENV_FILE": str(path.resolve())}
