"""The allocator of CPU ranks (launch/host_allocator.py): its choice, and that it does what it is for, in real
processes: a large block freed and taken again is reused instead of faulting in fresh pages.
(Its place in a launch plan: tests/launch/test_launcher.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from widenet_ds.launch.host_allocator import (
    GLIBC_KEEP_FREED,
    allocator_env,
    find_tcmalloc,
)


def test_tcmalloc_where_installed_else_glibc_kept_and_a_users_own_choice_left_alone():
    assert allocator_env({}, "libtcmalloc_minimal.so.4")["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
    assert allocator_env({}, None) == {"GLIBC_TUNABLES": GLIBC_KEEP_FREED}
    assert allocator_env({"LD_PRELOAD": "libjemalloc.so.2"}, "libtcmalloc_minimal.so.4") == {}
    assert allocator_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, None) == {}


# A 64 MiB block written and freed five times: the minor page faults of the last four rounds.
REFAULTS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def write_and_free():
    block = libc.malloc(64 * 2 ** 20)
    ctypes.memset(block, 1, 64 * 2 ** 20)
    libc.free(block)
write_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    write_and_free()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def refaults(allocator: dict[str, str]) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")} | allocator
    proc = subprocess.run([sys.executable, "-c", REFAULTS], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


def test_glibc_fallback_reuses_a_freed_large_block_instead_of_faulting_in_new_pages():
    """What the allocator setting is for: glibc's default maps a block this size afresh each time (16,384 page
    faults of 4 KiB per round, fewer with transparent huge pages); kept, it is reused."""
    default, kept = refaults({}), refaults(allocator_env({}, tcmalloc=None))
    assert default >= 4 * 32 and kept * 32 < default, (default, kept)


@pytest.mark.skipif(find_tcmalloc() is None, reason="tcmalloc not installed (Debian: libtcmalloc-minimal4; "
                                                    "./launcher.sh test installs it as root)")
def test_tcmalloc_where_installed_reuses_a_freed_large_block():
    default, kept = refaults({}), refaults(allocator_env({}, tcmalloc=find_tcmalloc()))
    assert default >= 4 * 32 and kept * 32 < default, (default, kept)
