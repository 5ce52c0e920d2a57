"""Start trainers and test scripts under the real `deepspeed` launcher with N local CPU ranks.

Trainers start the way users start them: `deepspeed --module widenet_ds.train TASK ...` (`train_command`,
`run_train`); the test scripts of tests/scripts/ by their path (`deepspeed_command`, `run_deepspeed`)."""

from __future__ import annotations

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


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deepspeed_launcher() -> str:
    return shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"


def deepspeed_command(script: str | Path, args: list[str], num_ranks: int = 2) -> list[str]:
    clear_stale_build_locks()
    return [deepspeed_launcher(), "--num_gpus", str(num_ranks), "--master_port", str(free_port()), str(script), *args]


def python_train_command(task: str, args: list[str]) -> list[str]:
    """`python -m widenet_ds.train TASK ARGS`: one rank, no launcher."""
    return [sys.executable, "-m", "widenet_ds.train", task, *args]


def train_command(task: str, args: list[str], num_ranks: int = 2) -> list[str]:
    """`deepspeed --module widenet_ds.train TASK ARGS` on `num_ranks` local ranks."""
    clear_stale_build_locks()
    return [deepspeed_launcher(), "--num_gpus", str(num_ranks), "--master_port", str(free_port()), "--module",
            "widenet_ds.train", task, *args]


def _run(command: list[str], timeout: int, env: dict[str, str] | None, check: bool) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, cwd=REPO, env=child_env(**(env or {})), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"deepspeed launcher failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def run_deepspeed(script: str | Path, args: list[str], num_ranks: int = 2, timeout: int = 300,
                  env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return _run(deepspeed_command(script, args, num_ranks), timeout, env, check)


def run_train(task: str, args: list[str], num_ranks: int = 2, timeout: int = 300, env: dict[str, str] | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    return _run(train_command(task, args, num_ranks), timeout, env, check)
