"""Where DeepSpeed JIT-builds its C++ ops (on CPU: the shared-memory all-reduce, built by the first
`init_distributed`), and the console line while a run waits for that build.

torch builds into `TORCH_EXTENSIONS_DIR`, by default one folder shared by every Python environment of the
user (~/.cache/torch_extensions/py311_cpu/). Its build file names the environment that built it, so a run
from another virtualenv rebuilds the op (minutes on a loaded machine) while every other run waits on the
build's lock, silently. Each environment gets its own folder instead: `<venv>/torch_extensions`, or
~/.cache/torch_extensions/<venv name>-<hash> when the environment is not writable. A TORCH_EXTENSIONS_DIR
set by the user stands.

torch builds with whichever `ninja` PATH finds first, and ninja versions record their builds differently
(pip's 1.13, a DeepSpeed dependency in the environment, and Debian's 1.11 hash the build commands
differently): each rebuilds what the other built. A run started with the virtualenv activated and one started
without (./launcher.sh, a Slurm job, mpiexec) rebuilt the op in turn, every time. The environment's own
`ninja` goes first on PATH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import MutableMapping
from pathlib import Path

SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's CPU shared-memory all-reduce (ShareMemCommBuilder)


def default_extensions_dir() -> Path:
    """This Python environment's own build folder."""
    inside = Path(sys.prefix) / "torch_extensions"
    if os.access(inside if inside.is_dir() else sys.prefix, os.W_OK):
        return inside
    tag = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    return Path.home() / ".cache" / "torch_extensions" / f"{Path(sys.prefix).name}-{tag}"


def use_environment_extensions_dir(environ: MutableMapping[str, str] | None = None) -> Path:
    """Set TORCH_EXTENSIONS_DIR to this environment's folder unless it is set; return the folder in use."""
    environ = os.environ if environ is None else environ
    return Path(environ.setdefault("TORCH_EXTENSIONS_DIR", str(default_extensions_dir())))


def use_environment_ninja(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Put this environment's `ninja` first on PATH (see above) and return it; None when the environment has
    none (PATH then decides, as before)."""
    environ = os.environ if environ is None else environ
    own_bin = str(Path(sys.executable).parent)
    own = shutil.which("ninja", path=own_bin)
    path = environ.get("PATH", "")
    if own is not None and shutil.which("ninja", path=path) != own:
        environ["PATH"] = os.pathsep.join(filter(None, [own_bin, path]))
    return own


def pending_build(extensions_dir: Path, op: str = SHM_OP) -> str | None:
    """The console line for a start-up that will build `op` or wait for another process building it; None
    when it is built. (A build whose sources changed is not foreseen: torch decides that while loading.)"""
    build = Path(extensions_dir) / op
    if (build / "lock").exists():
        return f"waiting for another process building DeepSpeed's shared-memory op in {build} (first run only)"
    if not any(build.glob(f"{op}*.so")):
        return (f"building DeepSpeed's shared-memory op: first run only, a few minutes on a busy machine "
                f"(into {build})")
    return None
