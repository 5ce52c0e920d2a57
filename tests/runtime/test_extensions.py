"""DeepSpeed's JIT-built ops live in a folder of this Python environment (another virtualenv's build never
invalidates ours) and are built by the environment's own ninja (another ninja on PATH never rebuilds them), a
folder set by the user stands, and a start-up that will build the op or wait for a build says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.launching import REPO, child_env
from widenet_ds.runtime.extensions import (SHM_OP, default_extensions_dir, pending_build,
                                           use_environment_extensions_dir, use_environment_ninja)

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
    assert "building DeepSpeed's shared-memory op: first run only" in pending_build(tmp_path)
    build = tmp_path / SHM_OP
    build.mkdir()
    (build / f"{SHM_OP}.so").write_bytes(b"")
    assert pending_build(tmp_path) is None
    (build / "lock").touch()  # another process is building it now
    assert "waiting for another process building DeepSpeed's shared-memory op" in pending_build(tmp_path)


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
    script = "from widenet_ds.runtime.distributed import init_distributed; init_distributed(); print('ok')"
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    assert not calls.exists(), f"the other ninja ran: {calls.read_text()}"
