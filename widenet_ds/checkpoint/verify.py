"""Checking a checkpoint's files against what was recorded when they were written (`widenet-ds verify` reads every
byte of one, as `widenet-ds verify-data` does for a data folder).

A training checkpoint's marker (`widenet_checkpoint.json`) records the size and SHA-256 of every other file
of its tag; an exported folder's `config.json` those of the weights, tokenizer and README. Trainers check
`--resume` and `--init-from` the same way before any rank builds an engine, and `widenet-ds convert` its
source before writing anything: a truncated or replaced file is named up front instead of failing inside
`torch.load` on one rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from widenet_ds.checkpoint.marker import CheckpointMeta
from widenet_ds.checkpoint.tags import check_checkpoint_files
from widenet_ds.errors import CheckpointError
from widenet_ds.fs.checksums import file_problems, total_size


@dataclass(frozen=True)
class Verified:
    path: Path   # the tag folder or exported folder checked
    files: int   # files checked (0: none recorded -- written by an older widenet-ds or another program)
    bytes: int


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
