"""DeepSpeed's JIT-built ops live in a folder of this Python environment (another virtualenv's build never
invalidates ours), a folder set by the user stands, and a start-up that will build the op or wait for a
build says so."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from widenet_ds.runtime.extensions import SHM_OP, default_extensions_dir, pending_build, use_environment_extensions_dir


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
