"""`widenet-ds verify`: read every byte of a checkpoint and check it against what was recorded when it was
written, as `widenet-ds verify-data` does for a data folder.

A training checkpoint's marker (`widenet_checkpoint.json`) records the size and SHA-256 of every other file
of its tag; an exported folder's `config.json` those of the weights, tokenizer and README. Trainers check
`--resume` and `--init-from` the same way before any rank builds an engine, and `widenet-ds convert` its
source before writing anything: a truncated or replaced file is named up front instead of failing inside
`torch.load` on one rank.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

from widenet_ds.checksums import file_problems, total_size
from widenet_ds.checkpoint.format import is_folder, read_folder_config
from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.training import check_checkpoint_files, resolve_tag_dir
from widenet_ds.disk_space import mib
from widenet_ds.errors import CheckpointError


@dataclass(frozen=True)
class Verified:
    path: Path   # the tag folder or exported folder checked
    files: int   # files checked (0: none recorded -- written by an older widenet-ds or another program)
    bytes: int


def verify_checkpoint(source: Path, tag: str | None = None,
                      use_other: Callable[[Path], str] = lambda tag_dir: f"--tag {tag_dir.name}") -> Verified:
    """Check the files of an exported folder, or of a DeepSpeed checkpoint's tag (`source` a tag folder, a
    checkpoints folder or a run folder; `tag`, else the latest); raise CheckpointError naming each damaged one
    and how to take another tag (`use_other`: `--tag stepN` for convert and verify)."""
    source = Path(source)
    if is_folder(source):
        if tag is not None:
            raise CheckpointError(f"{source} is a checkpoint folder, which has no tags; drop the tag {tag!r}.")
        return verify_folder(source, read_folder_config(source))
    tag_dir = resolve_tag_dir(source, tag, require_marker=False)
    return verify_tag(tag_dir, CheckpointMeta.read(tag_dir, required=False), use_other)


def verify_folder(folder: Path, config: dict) -> Verified:
    """An exported folder against the records of its config.json (`config`, as `read_folder_config` returns it:
    {} when the folder's version recorded none)."""
    records = config["files"]
    problems = file_problems(folder, records)
    if problems:
        raise CheckpointError(f"checkpoint folder {folder} is damaged: {len(problems)} of its {len(records)} files "
                              f"differ from what was written:\n  " + "\n  ".join(problems) + "\nRestore it from a "
                              f"copy, or write it again (`widenet-ds convert`).")
    return Verified(folder, len(records), total_size(records))


def verify_tag(tag_dir: Path, meta: CheckpointMeta | None, use_other: Callable[[Path], str]) -> Verified:
    """A DeepSpeed tag against its marker (`meta`, as read; None: another program's, nothing recorded)."""
    if meta is None:
        return Verified(tag_dir, 0, 0)
    check_checkpoint_files(tag_dir, meta, use_other)
    return Verified(tag_dir, len(meta.files), total_size(meta.files))


def cli(argv: list[str]) -> int:
    """`widenet-ds verify CHECKPOINT`: check every file of a checkpoint against its recorded SHA-256."""
    parser = argparse.ArgumentParser(prog="widenet-ds verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="an exported checkpoint folder, or a DeepSpeed checkpoint: a tag "
                                                      "folder, a checkpoints folder or a run folder")
    parser.add_argument("--tag", help="checkpoint tag, e.g. step1000 (default: the latest complete one)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    verified = verify_checkpoint(args.checkpoint, args.tag)
    if not verified.files:
        print(f"{verified.path}: no checksums recorded (written by an older widenet-ds or another program); "
              f"nothing to check against")
        return 0
    print(f"{verified.path}: {verified.files} files ({mib(verified.bytes)}) match their recorded sizes and SHA-256 "
          f"[{time.perf_counter() - start:.1f} s]")
    return 0
