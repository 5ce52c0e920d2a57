"""How often a process opens given files: start-up resolves each input once (issue 40), and these counts
check it."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def counted_opens(*paths: Path):
    """path -> how often this process opens it meanwhile (Python's audit hook sees every `open`)."""
    counts: collections.Counter = collections.Counter()
    watched, active = {str(p) for p in paths}, [True]

    def hook(event: str, args: tuple) -> None:
        if active[0] and event == "open" and isinstance(args[0], (str, os.PathLike)) and os.fspath(args[0]) in watched:
            counts[os.fspath(args[0])] += 1

    sys.addaudithook(hook)  # (a hook cannot be removed: it goes quiet)
    try:
        yield counts
    finally:
        active[0] = False
