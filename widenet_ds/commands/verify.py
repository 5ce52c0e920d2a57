"""`widenet-ds verify CHECKPOINT`: read every byte of a checkpoint and check it against what was recorded when it
was written (checkpoint/verify.py), as `widenet-ds verify-data` does for a data folder."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from widenet_ds.checkpoint.source import CONVERT, CheckpointSource
from widenet_ds.fs.disk_space import mib


def cli(argv: list[str]) -> int:
    """`widenet-ds verify CHECKPOINT`: check every file of a checkpoint against its recorded size and SHA-256."""
    parser = argparse.ArgumentParser(prog="widenet-ds verify", description=cli.__doc__)
    parser.add_argument("checkpoint", type=Path, help="an exported checkpoint folder, or a DeepSpeed checkpoint: a tag "
                                                      "folder, a checkpoints folder or a run folder")
    parser.add_argument("--tag", help="checkpoint tag, e.g. step1000 (default: the latest complete one)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    verified = CheckpointSource.open(args.checkpoint, "checkpoint", tag=args.tag, purpose=CONVERT).verified
    if not verified.files:
        print(f"{verified.path}: no checksums recorded (written by an older widenet-ds or another program); "
              f"nothing to check against")
        return 0
    print(f"{verified.path}: {verified.files} files ({mib(verified.bytes)}) match their recorded sizes and SHA-256 "
          f"[{time.perf_counter() - start:.1f} s]")
    return 0
