"""The one place that says how exact-value checks against stored assets (the golden loss curves, the legacy
logits) get the same fp32 numbers on every x86-64 CPU with AVX2 or newer (issue 21).

fp32 results on CPU depend on the kernels picked for the processor, and a stored number recorded on one
CPU differs from another CPU's by an ulp or two. Three libraries pick kernels per CPU; each is pinned to
one path that every x86-64 CPU runs with the same result:

- ATen (`ATEN_CPU_CAPABILITY=default`): the baseline x86-64 build of its kernels, no AVX and no FMA,
  instead of the AVX2 / AVX-512 builds (other vector widths, fused multiply-adds);
- MKL, matmuls (`MKL_CBWR=COMPATIBLE`): MKL's single SSE2 code path without the approximate
  rcpps/rsqrtps, the one reproducibility branch MKL honours on non-Intel CPUs too (MKL_CBWR=AVX2 is
  silently AUTO on an AMD CPU); with a fixed thread count, which is MKL's condition for it;
- oneDNN, GELU and convolutions: its JIT kernels differ per instruction set and torch has no environment
  switch for it, so ENTRY turns it off (torch then runs ATen's GELU and im2col + MKL convolutions).

One thread per process: ATen splits its reductions per thread. The switches are read at start-up, so
every such check runs in a fresh process: `run_portable` (deepspeed-launched) or `run_portable_python`.
What each switch changed, measured: tests/assets/README.md. The cost: 15-55 % more CPU time per run.
The numbers still depend on the versions of torch (and its MKL) and glibc: a new torch may need a
re-recording, with the reason in the commit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launching import REPO, child_env, run_deepspeed

PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MKL_DYNAMIC": "FALSE",  # MKL's reproducibility condition: no thread count chosen at run time
    "OMP_DYNAMIC": "FALSE",
}
# `ENTRY SCRIPT ARGS` or `ENTRY -m MODULE ARGS`: the entry with oneDNN off.
ENTRY = REPO / "tests" / "scripts" / "portable_entry.py"


def run_portable(entry: list[str], args: list[str], num_ranks: int, timeout: int = 300) -> subprocess.CompletedProcess:
    """A `deepspeed`-launched run of `entry` (a script path, or "-m", module[, task]) with portable arithmetic."""
    return run_deepspeed(ENTRY, [*entry, *args], num_ranks=num_ranks, timeout=timeout, env=PORTABLE_ENV)


def run_portable_python(script: Path, args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` (one process) with portable arithmetic; raises on a non-zero exit."""
    proc = subprocess.run([sys.executable, str(ENTRY), str(script), *args], cwd=REPO, env=child_env(**PORTABLE_ENV),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{script.name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc
