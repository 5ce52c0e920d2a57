"""Run a script under the real `deepspeed` launcher with N local CPU ranks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


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


def deepspeed_command(script: str | Path, args: list[str], num_ranks: int = 2) -> list[str]:
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    return [launcher, "--num_gpus", str(num_ranks), "--master_port", str(free_port()), str(script), *args]


def run_deepspeed(script: str | Path, args: list[str], num_ranks: int = 2, timeout: int = 300,
                  env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full_env = child_env(**(env or {}))
    proc = subprocess.run(deepspeed_command(script, args, num_ranks), cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"deepspeed launcher failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")
    return proc
