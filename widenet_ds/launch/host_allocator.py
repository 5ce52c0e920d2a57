"""The memory allocator of CPU ranks: a step's freed memory kept for the next step.

glibc's malloc maps every block over 32 MiB on its own and unmaps it when it is freed, so the large tensors
of a training step (widenet-base-e8's shared-expert weight gradients: 75 MB each, 24 a step) fault in fresh
zeroed pages every step; with the memory reused, a CPU step of albert-base or widenet-base ran 1.07-1.36x as
fast (docs/benchmarks.md, issue 26). `widenet-ds launch` gives its CPU ranks

* tcmalloc where it is installed (Debian's libtcmalloc-minimal4), as PyTorch's CPU performance guide
  recommends: the same speed as the next, and the lowest peak memory of the three; else
* glibc's malloc without per-block maps and without trimming (GLIBC_TUNABLES): the same speed, 6-13% more
  peak memory than glibc's default.

A user's own LD_PRELOAD or GLIBC_TUNABLES means the allocator is theirs to choose: nothing is added then.
"""

from __future__ import annotations

import ctypes.util
from collections.abc import Mapping

TCMALLOC = "tcmalloc_minimal"
GLIBC_KEEP_FREED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"


def find_tcmalloc() -> str | None:
    """tcmalloc's library name (e.g. libtcmalloc_minimal.so.4, found by the dynamic linker), or None."""
    return ctypes.util.find_library(TCMALLOC)


def allocator_env(environ: Mapping[str, str], tcmalloc: str | None) -> dict[str, str]:
    """The environment variables that give a CPU rank the allocator above."""
    if environ.get("LD_PRELOAD") or environ.get("GLIBC_TUNABLES"):
        return {}
    if tcmalloc:
        # Without the threshold, tcmalloc prints a line for every allocation over 1 GiB (MLM logits at large batch).
        return {"LD_PRELOAD": tcmalloc, "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2 ** 50)}
    return {"GLIBC_TUNABLES": GLIBC_KEEP_FREED}
