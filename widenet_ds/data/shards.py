"""Binary shards of pretraining examples: writer (temp name + rename), reader (memory-mapped), checks.

One shard = three files with a common stem, e.g. `train/part-00042`:
- `.bin`: token ids in the manifest's dtype (uint16 when the vocabulary fits, else uint32): first
  all examples' tokens back to back, then (static masking only) all mask positions, then all mask
  input ids;
- `.idx.npy`: int64 [examples, 6]: token offset, length, A length, SOP label, mask offset, mask count;
- `.json`: counts, byte sizes, SHA-256 of the `.bin`, and the settings hash. Written last: a shard
  without its `.json` is incomplete, whatever else exists.
Each file is written under a temporary name and renamed, so an interrupted run leaves no shard that
looks complete.
"""

from __future__ import annotations

import array
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from widenet_ds.atomic import atomic_write, atomic_write_bytes
from widenet_ds.errors import DataError

INDEX_COLUMNS = ("offset", "length", "a_length", "sop_label", "mask_offset", "mask_count")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id (and every position < 65536)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass
class ShardBuilder:
    """Collects examples in compact arrays (not Python lists: ids as objects would cost 8x)."""

    dtype: np.dtype
    tokens: array.array = field(init=False)
    mask_positions: array.array = field(init=False)
    mask_inputs: array.array = field(init=False)
    index: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        code = "H" if self.dtype == np.uint16 else "I"
        self.tokens, self.mask_positions, self.mask_inputs = array.array(code), array.array(code), array.array(code)

    def add(self, tokens: list[int], a_length: int, sop_label: int,
            mask_positions: list[int] = (), mask_inputs: list[int] = ()) -> None:
        self.index.append((len(self.tokens), len(tokens), a_length, sop_label,
                           len(self.mask_positions), len(mask_positions)))
        self.tokens.extend(tokens)
        self.mask_positions.extend(mask_positions)
        self.mask_inputs.extend(mask_inputs)

    def __len__(self) -> int:
        return len(self.index)

    def write(self, stem: Path, settings_sha256: str, stats: dict) -> dict:
        """Write the shard atomically; return its meta (also stored as `<stem>.json`)."""
        stem.parent.mkdir(parents=True, exist_ok=True)
        bin_path, idx_path, meta_path = shard_paths(stem)
        payload = b"".join(bytes(a) for a in (self.tokens, self.mask_positions, self.mask_inputs))
        index = np.asarray(self.index, dtype=np.int64).reshape(-1, len(INDEX_COLUMNS))
        meta = {
            "examples": len(self.index), "tokens": len(self.tokens), "masks": len(self.mask_positions),
            "bin_bytes": len(payload), "bin_sha256": hashlib.sha256(payload).hexdigest(),
            "settings_sha256": settings_sha256, "stats": stats,
        }
        atomic_write_bytes(bin_path, payload)
        atomic_write(idx_path, lambda handle: np.save(handle, index))
        atomic_write_bytes(meta_path, json.dumps(meta, sort_keys=True).encode())
        return meta


def shard_paths(stem: Path) -> tuple[Path, Path, Path]:
    return stem.with_suffix(".bin"), stem.with_suffix(".idx.npy"), stem.with_suffix(".json")


def read_complete_meta(stem: Path, settings_sha256: str) -> dict | None:
    """The meta of a finished shard written with these settings, else None (to be rebuilt)."""
    bin_path, idx_path, meta_path = shard_paths(stem)
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    if meta.get("settings_sha256") != settings_sha256 or not idx_path.is_file():
        return None
    if not bin_path.is_file() or bin_path.stat().st_size != meta["bin_bytes"]:
        return None
    return meta


class Shard:
    """A memory-mapped shard. Checks sizes against the manifest so a truncated file fails loudly."""

    def __init__(self, stem: Path, meta: dict, dtype: np.dtype):
        bin_path, idx_path, _ = shard_paths(stem)
        for path in (bin_path, idx_path):
            if not path.is_file():
                raise DataError(f"shard file {path} is missing; re-run `widenet-ds prepare-data` with the "
                                "same arguments to rebuild it")
        if bin_path.stat().st_size != meta["bin_bytes"]:
            raise DataError(f"shard {bin_path} has {bin_path.stat().st_size} bytes, the manifest says "
                            f"{meta['bin_bytes']}: the file is truncated or replaced; delete it and re-run "
                            "`widenet-ds prepare-data` with the same arguments")
        try:
            self.index = np.load(idx_path, mmap_mode="r")
        except ValueError as err:
            raise DataError(f"shard index {idx_path} is unreadable ({err}); delete it and re-run "
                            "`widenet-ds prepare-data` with the same arguments") from err
        if self.index.shape != (meta["examples"], len(INDEX_COLUMNS)):
            raise DataError(f"shard index {idx_path} has shape {self.index.shape}, expected "
                            f"({meta['examples']}, {len(INDEX_COLUMNS)}); re-run `widenet-ds prepare-data`")
        self.num_examples = meta["examples"]
        if meta["bin_bytes"]:
            data = np.memmap(bin_path, dtype=dtype, mode="r")
        else:
            data = np.zeros(0, dtype=dtype)  # mmap cannot map an empty file
        tokens, masks = meta["tokens"], meta["masks"]
        self.tokens = data[:tokens]
        self.mask_positions = data[tokens:tokens + masks]
        self.mask_inputs = data[tokens + masks:tokens + 2 * masks]

    def example(self, i: int) -> tuple[np.ndarray, int, int, np.ndarray, np.ndarray]:
        """(tokens, A length, SOP label, mask positions, mask inputs) of example `i`."""
        offset, length, a_length, sop_label, mask_offset, mask_count = (int(v) for v in self.index[i])
        return (self.tokens[offset:offset + length], a_length, sop_label,
                self.mask_positions[mask_offset:mask_offset + mask_count],
                self.mask_inputs[mask_offset:mask_offset + mask_count])


def verify_shard_checksum(stem: Path, meta: dict) -> None:
    """Full read + SHA-256 of a shard's `.bin` (slow on big data; the loader checks sizes only)."""
    digest = hashlib.sha256()
    with open(shard_paths(stem)[0], "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    if digest.hexdigest() != meta["bin_sha256"]:
        raise DataError(f"shard {stem}.bin does not match its checksum: the file is corrupt; delete it and "
                        "re-run `widenet-ds prepare-data` with the same arguments")


MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


def read_manifest(data_dir: Path) -> dict:
    """The manifest of a finished data folder (it is written only after every shard is complete)."""
    path = Path(data_dir) / MANIFEST_FILE
    if not Path(data_dir).is_dir():
        raise DataError(f"data folder {str(data_dir)!r} does not exist; run `widenet-ds prepare-data --output "
                        f"{data_dir} ...` first")
    if not path.is_file():
        raise DataError(f"{data_dir} has no {MANIFEST_FILE}: the preparation did not finish (or this is not a "
                        "prepared data folder); re-run `widenet-ds prepare-data` with the same arguments to "
                        "complete it")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:
        raise DataError(f"{path} is not valid JSON ({err}); re-run `widenet-ds prepare-data`") from err
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path} has format version {manifest.get('format_version')}, this widenet-ds reads "
                        f"{FORMAT_VERSION}; re-run `widenet-ds prepare-data` with this version")
    return manifest
