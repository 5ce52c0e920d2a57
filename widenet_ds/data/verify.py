"""`widenet-ds verify-data`: read every byte of a prepared data folder and check it against the manifest.

The loader checks cheaply (sizes at open, a CRC per block the first time an example touches it); this
command checks everything at once -- the tokenizer's hash and the SHA-256 of every shard file -- and
names each damaged file. A re-run of `prepare-data` with the same arguments rebuilds exactly those.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from widenet_ds.data.manifest import read_manifest
from widenet_ds.data.shards import shard_problems
from widenet_ds.data.tokenizer import TOKENIZER_FILE
from widenet_ds.errors import DataError
from widenet_ds.fs.checksums import file_sha256

REBUILD = ("Re-run `widenet-ds prepare-data` with the same arguments and --output: it rebuilds the damaged shards "
           "(byte-identical); a damaged tokenizer.json must be restored or the data prepared anew")


def data_folder_problems(data_dir: Path, hashes: Callable[[int], bool] = lambda index: True
                         ) -> tuple[list[str], dict[str, int]]:
    """Every damaged or missing file the manifest names, one line each, and the counts: the tokenizer's SHA-256, and
    each shard's files' (those of the shards whose place in the manifest `hashes` picks; of the others their presence
    and sizes: a preflight spreads the reading over its ranks)."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    problems: list[str] = []
    tokenizer = data_dir / TOKENIZER_FILE
    if not tokenizer.is_file():
        problems.append(f"{tokenizer}: missing")
    elif file_sha256(tokenizer) != manifest.tokenizer_sha256:
        problems.append(f"{tokenizer}: not the tokenizer the shards were built with (SHA-256 differs)")
    shards = files = legacy = 0
    for info in manifest.splits.values():
        for entry in info.shards:
            problems += shard_problems(data_dir / entry["name"], entry, contents=hashes(shards))
            shards += 1
            files += 2
            legacy += "idx_sha256" not in entry
    return problems, {"shards": shards, "files": files, "unindexed": legacy}


def verify_data(data_dir: Path) -> dict[str, int]:
    """Check every file the manifest names; raise DataError listing each damaged one. Returns counts."""
    problems, counts = data_folder_problems(data_dir)
    if problems:
        listed = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise DataError(f"{data_dir}: {len(problems)} damaged or missing file(s):\n  {listed}\n{REBUILD}")
    return counts


def cli(argv: list[str]) -> int:
    """`widenet-ds verify-data DATA`: check every shard and the tokenizer of a prepared data folder."""
    parser = argparse.ArgumentParser(prog="widenet-ds verify-data", description=cli.__doc__)
    parser.add_argument("data", type=Path, help="a data folder written by `widenet-ds prepare-data`")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    counts = verify_data(args.data)
    note = (f" ({counts['unindexed']} shard(s) from an older widenet-ds: their .idx.npy has no checksum)"
            if counts["unindexed"] else "")
    print(f"{args.data}: {counts['shards']} shards ({counts['files']} files) and the tokenizer match the manifest"
          f"{note} [{time.perf_counter() - start:.1f} s]")
    return 0
