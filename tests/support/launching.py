"""Start trainers and test scripts under DeepSpeed's real launcher with N local CPU ranks.

Trainers start the way `deepspeed --module widenet_ds.train TASK ...` starts them (`train_command`, `run_train`);
the test scripts of tests/scripts/ by their path (`deepspeed_command`, `run_deepspeed`). For a one-node job the
`deepspeed` command (deepspeed/launcher/runner.py) only builds one command line and waits on it:
`python -m deepspeed.launcher.launch --world_info=... SCRIPT ...`, the per-node launcher that starts, watches and
signals the ranks. These helpers run that command line themselves: the runner's own import of torch and DeepSpeed
is about 3 s of CPU per launch, a tenth of the suite's time. One rank starts with plain python, without the
per-node launcher either. The runner in front is tested where it is the subject
(tests/integration/test_entry_scripts.py, `widenet-ds launch`, the hostfile and Slurm tests)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


STALE_LOCK_SECONDS = 300  # a real build of DeepSpeed's shm op takes ~1 min


def clear_stale_build_locks() -> list[Path]:
    """Remove JIT-build locks older than any real build. torch's cpp_extension takes a `lock` file in the
    extension's build folder whenever a process loads DeepSpeed's shm op; a rank killed at that moment (the
    SIGKILL tests, a cancelled run) leaves it behind, and every later rank then waits for it forever."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    now = time.time()
    # <dir>/<op>/lock when TORCH_EXTENSIONS_DIR is set (conftest does), <dir>/<py_cpu tag>/<op>/lock by default
    locks = [*root.glob("*/lock"), *root.glob("*/*/lock")]
    stale = [lock for lock in locks if now - lock.stat().st_mtime > STALE_LOCK_SECONDS]
    for lock in stale:
        lock.unlink(missing_ok=True)
    return stale


def child_env(**extra: str) -> dict[str, str]:
    """This environment without the rank variables of the test process's own 1-rank group (the `dist`
    fixture exports them): a child inheriting MASTER_PORT would try to bind the port this process holds."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


BIN = Path(sys.executable).parent
LAUNCHER_SH = REPO / "launcher.sh"
WIDENET_DS = [sys.executable, "-m", "widenet_ds.cli"]
TRAIN = [sys.executable, "-m", "widenet_ds.train"]


def launcher_env(**extra: str) -> dict[str, str]:
    """A user's shell for a launcher run: no rank variables of this test process, no scheduler's or MPI's
    variables, the venv's tools first."""
    env = {k: v for k, v in child_env().items() if not k.startswith(("SLURM_", "PMI_", "OMPI_"))}
    return {**env, "PATH": f"{BIN}:{env['PATH']}", "WIDENET_VENV": str(BIN.parent), **extra}


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deepspeed_launcher() -> str:
    return shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"


def local_launch(num_ranks: int) -> list[str]:
    """DeepSpeed's per-node launcher for `num_ranks` ranks on this machine: the command line `deepspeed --num_gpus
    N --master_port P` runs for a one-node job (runner.py: world_info is {"localhost": [0, ..., N-1]}, base64)."""
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(num_ranks))}).encode()).decode()
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}"]


def deepspeed_command(script: str | Path, args: list[str], num_ranks: int = 2, runner: bool = False) -> list[str]:
    """`runner`: through the `deepspeed` command itself, where its front is what a test checks. One rank without it
    runs the script with plain python (as `train_command` does)."""
    clear_stale_build_locks()
    if runner:
        return [deepspeed_launcher(), "--num_gpus", str(num_ranks), "--master_port", str(free_port()), str(script),
                *args]
    if num_ranks == 1:
        return [sys.executable, "-u", str(script), *args]
    return [*local_launch(num_ranks), str(script), *args]


def python_train_command(task: str, args: list[str]) -> list[str]:
    """`python -m widenet_ds.train TASK ARGS`: one rank, no launcher."""
    return [sys.executable, "-m", "widenet_ds.train", task, *args]


def train_command(task: str, args: list[str], num_ranks: int = 2) -> list[str]:
    """What `deepspeed --num_gpus N --module widenet_ds.train TASK ARGS` runs, on `num_ranks` local ranks. One rank
    starts without a launcher (`python_train_command`), as a user starts one: the launcher adds nothing one process
    needs (distributed/launch_env.py gives it a group and a free port) and costs 1.4 s of CPU, 2.8 s of wall time."""
    clear_stale_build_locks()
    if num_ranks == 1:
        return python_train_command(task, args)
    return [*local_launch(num_ranks), "--module", "widenet_ds.train", task, *args]


def _run(command: list[str], timeout: int, env: dict[str, str] | None, check: bool) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, cwd=REPO, env=child_env(**(env or {})), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"deepspeed launcher failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def run_deepspeed(script: str | Path, args: list[str], num_ranks: int = 2, timeout: int = 300,
                  env: dict[str, str] | None = None, check: bool = True, runner: bool = False
                  ) -> subprocess.CompletedProcess:
    return _run(deepspeed_command(script, args, num_ranks, runner), timeout, env, check)


def run_train(task: str, args: list[str], num_ranks: int = 2, timeout: int = 300, env: dict[str, str] | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    return _run(train_command(task, args, num_ranks), timeout, env, check)
