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

A first run builds each op it needs (on CPU: the shared-memory all-reduce when the process group starts,
`fused_adam` for an Adam JSON, `cpu_adam` for an offloaded optimizer; on GPU its kernels), for a minute or more
with nothing else on the console. `announce_op_builds` says each build as it starts (or the wait for another
process's), who builds it, and every TICK_SECONDS that time passes, until the op is loaded.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path

SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's CPU shared-memory all-reduce (ShareMemCommBuilder)
OP_NAMES = {SHM_OP: "shared-memory op"}
TICK_SECONDS = 15.0
_announcing: list[Callable[[str], None]] = []  # the `say` of announce_op_builds, once installed


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


def _op_name(op: str) -> str:
    return f"DeepSpeed's {OP_NAMES.get(op, op + ' op')}"


def pending_build(extensions_dir: Path, op: str = SHM_OP, *, own: bool = False) -> str | None:
    """The console line for a start-up that will build `op` or wait for another process building it; None
    when it is built, or when `announce_op_builds` says it as it happens (`own`: its own call). (A build whose
    sources changed is not foreseen: torch decides that while loading.)"""
    if _announcing and not own:
        return None
    build = Path(extensions_dir) / op
    if (build / "lock").exists():
        return (f"waiting for {_op_name(op)}: {builder_of(build) or 'another process'} is building it in {build} "
                f"(first run only; on a first start, another rank of this run)")
    if not any(build.glob(f"{op}*.so")):
        return (f"building {_op_name(op)} into {build}: first run of this environment only, a few minutes on a "
                f"busy machine; one process builds it, the others (this run's other ranks too) wait")
    return None


def builder_of(build: Path) -> str | None:
    """Who is building in `build` now: the process that started the compiler running there (torch runs ninja in
    the build folder), named by its PID and, for a rank of a run, its rank. None when no compiler runs there."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd") != str(build):
                continue
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = dict(item.split("=", 1) for item in (Path("/proc") / str(parent) / "environ").read_bytes()
                           .decode(errors="replace").split("\0") if "=" in item)
        except (OSError, ValueError, IndexError):  # gone meanwhile, or another user's
            continue
        if parent == os.getpid():
            return "this process"
        same_run = environ.get("MASTER_PORT") is not None and environ.get("MASTER_PORT") == os.environ.get("MASTER_PORT")
        rank = f"rank {environ['RANK']} of this run, " if same_run and "RANK" in environ else ""
        return f"{rank}PID {parent}"
    return None


@contextmanager
def announce_build(op: str, extensions_dir: Path, say: Callable[[str], None],
                   tick: float = TICK_SECONDS) -> Iterator[None]:
    """Around the load of `op`: nothing when it is built; else its line, one every `tick` seconds while it
    builds or waits (with who builds, once a compiler runs), and one when it is loaded."""
    line = pending_build(extensions_dir, op, own=True)
    if line is None:
        yield
        return
    say(line)
    build, start, done = Path(extensions_dir) / op, time.monotonic(), threading.Event()

    def ticking() -> None:
        while not done.wait(tick):
            who = builder_of(build)
            say(f"{_op_name(op)}: {'building' if who else 'waiting for the build'}, {time.monotonic() - start:.0f} s "
                f"so far" + (f" (built by {who})" if who else ""))

    ticker = threading.Thread(target=ticking, name=f"announce-{op}", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
    say(f"{_op_name(op)} is ready ({time.monotonic() - start:.0f} s); later runs load it at once")


def announce_op_builds(say: Callable[[str], None]) -> None:
    """From now on, every op DeepSpeed JIT-builds in this process is announced as it starts (`announce_build`),
    in place of `pending_build`'s line. Installed once per process, before anything loads an op."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    _announcing[:] = [say]
    if getattr(OpBuilder.jit_load, "announced", False):
        return
    original = OpBuilder.jit_load

    @functools.wraps(original)
    def jit_load(builder, *args, **kwargs):
        with announce_build(builder.name, use_environment_extensions_dir(), _announcing[0]):
            return original(builder, *args, **kwargs)

    jit_load.announced = True  # type: ignore[attr-defined]
    OpBuilder.jit_load = jit_load
