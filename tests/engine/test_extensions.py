"""DeepSpeed's JIT-built ops live in a folder of this Python environment (another virtualenv's build never
invalidates ours) and are built by the environment's own ninja (another ninja on PATH never rebuilds them), a
folder set by the user stands, and a start-up that will build the op or wait for a build says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launching import REPO, child_env
from widenet_ds.engine.extensions import (
    SHM_OP,
    announce_build,
    builder_of,
    default_extensions_dir,
    pending_build,
    use_environment_extensions_dir,
    use_environment_ninja,
)

OWN_NINJA = Path(sys.executable).parent / "ninja"  # pip's, installed with deepspeed


def test_each_environment_builds_into_its_own_folder_unless_one_is_set(tmp_path):
    own = default_extensions_dir()
    if os.access(sys.prefix, os.W_OK):
        assert own == Path(sys.prefix) / "torch_extensions"
    else:  # a system Python: a folder per environment under the user's cache
        assert own.parent == Path.home() / ".cache" / "torch_extensions" and own.name.startswith(Path(sys.prefix).name)
    environ: dict[str, str] = {}
    assert use_environment_extensions_dir(environ) == own and environ["TORCH_EXTENSIONS_DIR"] == str(own)
    environ = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    assert use_environment_extensions_dir(environ) == tmp_path  # the user's choice stands
    # the test session (tests/conftest.py) and the runs it starts use the same folder as real runs
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(own)


def test_a_start_up_that_will_build_or_wait_says_so(tmp_path):
    # own=True: the line itself, also in a test process where a run installed `announce_op_builds` (which then
    # says it as the build happens, and a plain pending_build stays quiet)
    assert f"building DeepSpeed's shared-memory op into {tmp_path / SHM_OP}: first run of this environment only" \
        in pending_build(tmp_path, own=True)
    build = tmp_path / SHM_OP
    build.mkdir()
    (build / f"{SHM_OP}.so").write_bytes(b"")
    assert pending_build(tmp_path, own=True) is None
    (build / "lock").touch()  # another process is building it now
    assert "waiting for DeepSpeed's shared-memory op: another process is building it" in pending_build(tmp_path,
                                                                                                      own=True)


def test_a_build_says_who_builds_it_and_that_time_passes(tmp_path, monkeypatch):
    """Item 5: a wait for another process's build names it (a rank of this run: its rank and PID, found by the
    compiler it runs in the build folder) and says every tick how long it has been, then that the op is ready."""
    build = tmp_path / "fused_adam"
    build.mkdir()
    (build / "lock").touch()
    monkeypatch.setenv("MASTER_PORT", "29517")
    # a rank of this run (RANK 1, the same MASTER_PORT) running a "compiler" in the build folder, as torch runs ninja
    rank = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run(['sleep', '30'], "
                                                   f"cwd={str(build)!r})"],
                            env={**os.environ, "RANK": "1", "MASTER_PORT": "29517"})
    try:
        deadline = time.monotonic() + 20
        while builder_of(build) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        lines: list[str] = []
        with announce_build("fused_adam", tmp_path, lines.append, tick=0.3):
            time.sleep(1.0)
    finally:
        rank.kill()
        rank.wait()
    who = f"rank 1 of this run, PID {rank.pid}"
    assert lines[0] == (f"waiting for DeepSpeed's fused_adam op: {who} is building it in {build} (first run only; on "
                        f"a first start, another rank of this run)")
    ticks = [line for line in lines[1:-1] if line.startswith("DeepSpeed's fused_adam op: building, ")]
    assert len(ticks) >= 2 and all(line.endswith(f"s so far (built by {who})") for line in ticks), lines
    assert lines[-1].startswith("DeepSpeed's fused_adam op is ready (") and len(lines) == len(ticks) + 2, lines
    # built: nothing is said
    (build / "lock").unlink()
    (build / "fused_adam.so").write_bytes(b"")
    with announce_build("fused_adam", tmp_path, lines.append, tick=0.1):
        time.sleep(0.3)
    assert len(lines) == len(ticks) + 2


TINY_OP = """
#include <pybind11/pybind11.h>
int one() { return 1; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("one", &one); }
"""
TINY_BUILDER = """
import sys
from widenet_ds.engine.extensions import announce_op_builds
announce_op_builds(print)
from deepspeed.ops.op_builder.builder import OpBuilder


class TinyBuilder(OpBuilder):  # an op of DeepSpeed's builder, as fused_adam's, that compiles in seconds
    BUILD_VAR, NAME = "DS_BUILD_TINY_OP", "tiny_op"

    def __init__(self):
        super().__init__(name=self.NAME)

    def absolute_name(self):
        return self.NAME

    def sources(self):
        return [sys.argv[1]]

    def include_paths(self):
        return []

    def cxx_args(self):
        return ["-O0"]

    def extra_ldflags(self):
        return []


assert TinyBuilder().load().one() == 1
"""


@pytest.mark.slow
def test_a_first_run_s_op_build_is_announced_as_it_happens(tmp_path):
    """Item 2: any op DeepSpeed JIT-builds (its CPU fused_adam, which an Adam JSON without torch_adam loads, e.g.
    ds_configs/finetune_squad11.json, took 313 s to build on 2 cores) goes through OpBuilder.jit_load, which the
    hook a run installs wraps: a real build of a one-function op into a fresh folder is said as it starts, then
    ready; loaded again, nothing."""
    (tmp_path / "tiny.cpp").write_text(TINY_OP)
    (tmp_path / "build_tiny.py").write_text(TINY_BUILDER)
    command = [sys.executable, str(tmp_path / "build_tiny.py"), str(tmp_path / "tiny.cpp")]
    env = child_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), DS_ACCELERATOR="cpu")
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"building DeepSpeed's tiny_op op into {tmp_path / 'ext' / 'tiny_op'}: first run"), lines
    assert lines[-1].startswith("DeepSpeed's tiny_op op is ready ("), lines
    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr[-2000:]


def another_ninja(folder: Path, marker: Path) -> Path:
    """A `ninja` that notes each call in `marker`, then runs the environment's: another version on PATH."""
    folder.mkdir()
    ninja = folder / "ninja"
    ninja.write_text(f'#!/bin/sh\necho "$@" >> {marker}\nexec {OWN_NINJA} "$@"\n')
    ninja.chmod(0o755)
    return folder


def test_the_environment_s_ninja_goes_first_on_path(tmp_path):
    assert OWN_NINJA.is_file(), "ninja comes with deepspeed (pip); ./launcher.sh setup installs it"
    other = another_ninja(tmp_path / "bin", tmp_path / "calls")
    environ = {"PATH": f"{other}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    assert use_environment_ninja(environ) == str(OWN_NINJA)
    assert shutil.which("ninja", path=environ["PATH"]) == str(OWN_NINJA)
    first = environ["PATH"]
    use_environment_ninja(environ)
    assert environ["PATH"] == first  # already first: PATH is left as it is


def test_a_rank_builds_and_loads_the_op_with_the_environment_s_ninja(tmp_path):
    # Before, a rank used the first ninja on PATH: Debian's 1.11 and pip's 1.13 each rebuilt the op the other had
    # built (~40 s of both cores), so runs with and without the virtualenv activated rebuilt it in turn.
    calls = tmp_path / "calls"
    other = another_ninja(tmp_path / "bin", calls)
    env = child_env(PATH=f"{other}{os.pathsep}{os.environ['PATH']}")
    script = "from widenet_ds.distributed.groups import init_distributed; init_distributed(); print('ok')"
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    assert not calls.exists(), f"the other ninja ran: {calls.read_text()}"
