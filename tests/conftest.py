"""Shared fixtures: the shared data folder, a 1-rank process group, the deepspeed launcher."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from widenet_ds.engine.extensions import default_extensions_dir

REPO = Path(__file__).resolve().parents[1]
# DeepSpeed JIT-builds its shm op into TORCH_EXTENSIONS_DIR: the folder of this environment that real runs use
# (widenet_ds/engine/extensions.py), set here too so that the stale-lock clean-up below looks there.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(default_extensions_dir()))


def shared_data_dir() -> Path:
    return Path(os.environ.get("WIDENET_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path}; set WIDENET_SHARED_DATA to the shared/data folder")
    return path


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk("20m")`: a real file system of that size (a tmpfs; mounting needs root, and where it is
    refused the test is skipped with the reason). Unmounted at the end; `small_disk.resize(path, "40m")`
    frees space the way a user deleting files elsewhere would, `small_disk.fill(path)` takes all of it."""
    mounted: list[Path] = []

    def make(size: str, skip: bool = True) -> Path | None:
        """The mounted disk; where none can be mounted, the test skipped (or None with skip=False)."""
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            if not skip:
                return None
            pytest.skip(f"no small tmpfs can be mounted here ({(proc.stderr or 'mount refused').strip()}); the "
                        f"simulated full-disk tests cover the same paths")
        mounted.append(path)
        return path

    def resize(path: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)

    def fill(path: Path) -> Path:
        """A file in `path` taking every free byte of its disk, as another program's would."""
        filler = path / "filler.bin"
        with pytest.raises(OSError, match="No space left on device"), open(filler, "wb", buffering=0) as handle:
            while True:
                handle.write(bytes(4096))
        return filler

    make.resize, make.fill = resize, fill
    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture(scope="session")
def dist():
    """A 1-rank gloo group: DeepSpeed's MoE all-to-all needs one even with ep_size 1."""
    from widenet_ds.distributed.groups import init_distributed
    init_distributed()
    yield


@pytest.fixture(scope="session", autouse=True)
def no_stale_build_locks():
    """A lock left by an earlier killed process would hang every multi-rank test (see tests/support/launching.py)."""
    from tests.support.launching import clear_stale_build_locks
    for lock in clear_stale_build_locks():
        print(f"removed a stale JIT-build lock: {lock}")
    _remove_orphaned_shm_buffers()
    yield
    _remove_orphaned_shm_buffers()  # this session's killed ranks' (several GB after a full run)


def _remove_orphaned_shm_buffers() -> None:
    """DeepSpeed's CPU shm all-reduce keeps ~60 MB per rank in /dev/shm (RAM), named by port; a SIGKILLed
    rank never unlinks its buffer. A buffer still mapped by a live process belongs to a run of another
    session (or checkout) and is left alone."""
    # A rank creates its buffer by writing ~64 MB and maps it only then: a buffer younger than a minute may
    # be one a live run is still creating (deleting it left the other rank spinning, waiting for it).
    buffers = [b for b in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*") if _age_seconds(b) > 60]
    in_use = _mapped_files()  # read after the listing: a buffer mapped in between is kept
    for buffer in buffers:
        if str(buffer) not in in_use:
            buffer.unlink(missing_ok=True)


def _age_seconds(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _mapped_files() -> set[str]:
    """The paths of the files mapped by any process this user can see (from /proc/<pid>/maps)."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours
            continue
        fields = (line.split(maxsplit=5) for line in text.splitlines())
        mapped.update(f[5] for f in fields if len(f) == 6)  # address perms offset dev inode path
    return mapped


def pytest_configure(config):
    """One torch thread per worker when there are several; one cache of prepared data folders for the session
    (tests/support/pretrain_support.py, `prepare_data`), made by the process that starts the workers, which inherit
    its environment."""
    from tests.support.pretrain_support import DATA_CACHE_VAR

    # Each of several workers trains in its own process on its share of the cores: one torch thread each. torch's
    # default, a thread per core in every worker, left OpenMP threads spinning for a core another worker held
    # (lane 1's training, vision and model tests on 2 cores: 87 s, 167 s of CPU; with one thread 26 s, 43 s).
    if hasattr(config, "workerinput") and int(config.workerinput["workercount"]) > 1:
        import torch

        torch.set_num_threads(1)
    if not hasattr(config, "workerinput") and DATA_CACHE_VAR not in os.environ:
        config.prepared_data_cache = tempfile.mkdtemp(prefix="widenet-test-prepared-")
        os.environ[DATA_CACHE_VAR] = config.prepared_data_cache


def pytest_unconfigure(config):
    from tests.support.pretrain_support import DATA_CACHE_VAR

    cache = getattr(config, "prepared_data_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop(DATA_CACHE_VAR, None)


def pytest_collection_modifyitems(config, items):
    """The files holding `slow` tests first (stable otherwise). The suite's workers take a file at a time in
    collection order (`--dist loadfile --no-loadscope-reorder`: xdist's default orders files by their number of
    tests instead), so a slow file collected late ran on one worker while the other had nothing left: a tail of
    several minutes on 2 cores."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
