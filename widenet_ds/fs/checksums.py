"""Sizes and SHA-256 of the files of a folder, recorded when it is written and checked before it is read.

A checkpoint's marker (`widenet_checkpoint.json`) and an exported folder's `config.json` record every other
file of their folder this way, as a data folder's manifest records its shards: a truncated or replaced file
is then named before anything loads it, instead of failing deep inside `torch.load` on one rank.
Hashing reads every byte once: about 1 s per GB on one core.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

FileRecords = dict[str, dict[str, Any]]  # relative path -> {"size": bytes, "sha256": hex}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def record_files(folder: Path, skip: tuple[str, ...] = ()) -> FileRecords:
    """Every file below `folder` (relative paths, sorted) but those named in `skip`."""
    folder = Path(folder)
    return {path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": file_sha256(path)}
            for path in sorted(folder.rglob("*")) if path.is_file() and path.relative_to(folder).as_posix() not in skip}


def file_problems(folder: Path, records: FileRecords) -> list[str]:
    """One line per recorded file that is missing, of another size (truncated, grown) or other content."""
    problems = []
    for name, record in sorted(records.items()):
        path = Path(folder) / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != record["size"]:
            problems.append(f"{path}: {path.stat().st_size:,} bytes, written with {record['size']:,} "
                            f"({'truncated' if path.stat().st_size < record['size'] else 'grown'})")
        elif file_sha256(path) != record["sha256"]:
            problems.append(f"{path}: content differs from what was written (SHA-256)")
    return problems


def total_size(records: FileRecords) -> int:
    return sum(record["size"] for record in records.values())
