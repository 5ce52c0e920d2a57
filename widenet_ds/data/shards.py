"""Binary shards of pretraining examples: writer (temp name + rename), reader (memory-mapped), checks.

One shard = three files with a common stem, e.g. `train/part-00042`:
- `.bin`: token ids in the manifest's dtype (uint16 when the vocabulary fits, else uint32): first
  all examples' tokens back to back, then (static masking only) all mask positions, then all mask
  input ids;
- `.idx.npy`: int64 [examples, 6]: token offset, length, A length, SOP label, mask offset, mask count;
- `.json`: counts, byte sizes, SHA-256 of the `.bin` and `.idx.npy`, a CRC-32 per `BLOCK_BYTES` block
  of each, and the settings hash. Written last: a shard without its `.json` is incomplete, whatever
  else exists.
Each file is written under a temporary name and renamed, so an interrupted run leaves no shard that
looks complete.

Integrity: the manifest carries every shard's checksums. Opening a shard checks the file sizes and the
first and last block; each further block is CRC-checked the first time an example touches it, so no
damaged byte is ever trained on and the cost is one pass over the data spread over the epoch.
`widenet-ds verify-data` checks everything at once (SHA-256), and a re-run of `prepare-data` rebuilds
any shard whose files do not match their checksums.
"""

from __future__ import annotations

import array
import hashlib
import io
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from widenet_ds.errors import DataError
from widenet_ds.fs.atomic import atomic_write_bytes
from widenet_ds.fs.checksums import file_sha256

INDEX_COLUMNS = ("offset", "length", "a_length", "sop_label", "mask_offset", "mask_count")
# Unit of the lazy CRC checks: small enough that the first touch of a block costs well under a
# millisecond, large enough that the manifest stays small (one number per MiB of data).
BLOCK_BYTES = 1 << 20
# The checksum fields a shard's meta (and the manifest's shard entry) carries.
CHECKSUM_KEYS = ("bin_bytes", "bin_sha256", "idx_bytes", "idx_sha256", "block_bytes", "bin_crc32", "idx_crc32")
_REBUILD = "re-run `widenet-ds prepare-data` with the same arguments and --output: it rebuilds damaged shards"


def block_crc32(data: bytes | memoryview, block_bytes: int = BLOCK_BYTES) -> list[int]:
    view = memoryview(data)
    return [zlib.crc32(view[start:start + block_bytes]) for start in range(0, len(view), block_bytes)]


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
        buffer = io.BytesIO()
        np.save(buffer, index)
        index_bytes = buffer.getvalue()
        meta = {
            "examples": len(self.index), "tokens": len(self.tokens), "masks": len(self.mask_positions),
            "bin_bytes": len(payload), "bin_sha256": hashlib.sha256(payload).hexdigest(),
            "idx_bytes": len(index_bytes), "idx_sha256": hashlib.sha256(index_bytes).hexdigest(),
            "block_bytes": BLOCK_BYTES, "bin_crc32": block_crc32(payload), "idx_crc32": block_crc32(index_bytes),
            "settings_sha256": settings_sha256, "stats": stats,
        }
        atomic_write_bytes(bin_path, payload)
        atomic_write_bytes(idx_path, index_bytes)
        atomic_write_bytes(meta_path, json.dumps(meta, sort_keys=True).encode())
        return meta


def shard_paths(stem: Path) -> tuple[Path, Path, Path]:
    return stem.with_suffix(".bin"), stem.with_suffix(".idx.npy"), stem.with_suffix(".json")


def read_complete_meta(stem: Path, settings_sha256: str) -> dict | None:
    """The meta of a finished, undamaged shard written with these settings, else None (to be rebuilt)."""
    meta = read_shard_meta(stem)
    if meta is None or meta.get("settings_sha256") != settings_sha256:
        return None
    return None if shard_problems(stem, meta) else meta


def read_shard_meta(stem: Path) -> dict | None:
    """A shard's own `.json` meta; None when it is missing or unreadable (the shard is unfinished)."""
    try:
        meta = json.loads(shard_paths(stem)[2].read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "bin_bytes" in meta else None


def shard_problems(stem: Path, meta: dict, contents: bool = True) -> list[str]:
    """Full check (reads every byte; `contents` False: the files' presence and sizes only): what is wrong with a
    shard's files, one line per damaged file."""
    bin_path, idx_path, _ = shard_paths(stem)
    problems = []
    for path, size_key, sha_key in ((bin_path, "bin_bytes", "bin_sha256"), (idx_path, "idx_bytes", "idx_sha256")):
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif size_key in meta and path.stat().st_size != meta[size_key]:
            problems.append(f"{path}: {path.stat().st_size} bytes, the checksums say {meta[size_key]}")
        elif contents and sha_key in meta and file_sha256(path) != meta[sha_key]:
            problems.append(f"{path}: content does not match its checksum (SHA-256): the file is damaged")
    return problems


class Shard:
    """A memory-mapped shard. Checks sizes (and the first and last block) at open; every other block
    is CRC-checked when an example first touches it; ids are range-checked per example."""

    def __init__(self, stem: Path, meta: dict, dtype: np.dtype, vocab_size: int | None = None):
        bin_path, idx_path, _ = shard_paths(stem)
        self.bin_path, self.idx_path, self.vocab_size = bin_path, idx_path, vocab_size
        for path in (bin_path, idx_path):
            if not path.is_file():
                raise DataError(f"shard file {path} is missing; {_REBUILD}")
        for path, key in ((bin_path, "bin_bytes"), (idx_path, "idx_bytes")):
            if key in meta and path.stat().st_size != meta[key]:
                raise DataError(f"shard {path} has {path.stat().st_size} bytes, the manifest says {meta[key]}: the "
                                f"file is truncated or replaced; {_REBUILD}")
        # Lazy block checks: (raw bytes, CRC per block, verified flags) per file, when the manifest has them.
        self._blocks: dict[Path, tuple[np.ndarray, list[int], np.ndarray]] = {}
        self.block_bytes = int(meta.get("block_bytes") or BLOCK_BYTES)
        for path, key in ((bin_path, "bin_crc32"), (idx_path, "idx_crc32")):
            crcs = meta.get(key)
            if crcs and path.stat().st_size:
                raw = np.memmap(path, dtype=np.uint8, mode="r")
                self._blocks[path] = (raw, list(crcs), np.zeros(len(crcs), dtype=bool))
                self._verify(path, 0, 1)
                self._verify(path, raw.size - 1, raw.size)
        if idx_path in self._blocks:
            self._verify(idx_path, 0, 128)  # the .npy header
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
        self.row_offset = self._blocks[idx_path][0].size - self.index.nbytes if idx_path in self._blocks else 0
        self.itemsize = np.dtype(dtype).itemsize

    def _verify(self, path: Path, start: int, end: int) -> None:
        """CRC-check the blocks of `path` holding bytes [start, end) that are not checked yet."""
        entry = self._blocks.get(path)
        if entry is None or end <= start:
            return
        raw, crcs, verified = entry
        for block in range(start // self.block_bytes, min((end - 1) // self.block_bytes + 1, len(crcs))):
            if not verified[block]:
                begin = block * self.block_bytes
                if zlib.crc32(raw[begin:begin + self.block_bytes]) != crcs[block]:
                    raise DataError(f"shard file {path} is damaged: bytes {begin}-{begin + self.block_bytes} do not "
                                    f"match the checksum in the manifest; {_REBUILD} (`widenet-ds verify-data` "
                                    "lists every damaged file)")
                verified[block] = True

    def _damaged(self, i: int, what: str) -> DataError:
        return DataError(f"shard {self.bin_path} (example {i}): {what}; the shard is damaged, {_REBUILD}")

    def example(self, i: int) -> tuple[np.ndarray, int, int, np.ndarray, np.ndarray]:
        """(tokens, A length, SOP label, mask positions, mask inputs) of example `i`."""
        row_bytes = len(INDEX_COLUMNS) * 8
        self._verify(self.idx_path, self.row_offset + i * row_bytes, self.row_offset + (i + 1) * row_bytes)
        offset, length, a_length, sop_label, mask_offset, mask_count = (int(v) for v in self.index[i])
        if not (0 <= offset and 0 < length and offset + length <= len(self.tokens) and 0 <= a_length <= length
                and sop_label in (0, 1) and 0 <= mask_offset and 0 <= mask_count
                and mask_offset + mask_count <= len(self.mask_positions)):
            raise self._damaged(i, f"its index row {[offset, length, a_length, sop_label, mask_offset, mask_count]} "
                                   "points outside the shard")
        size = self.itemsize
        self._verify(self.bin_path, offset * size, (offset + length) * size)
        if mask_count:
            masks = len(self.tokens) * size
            self._verify(self.bin_path, masks + mask_offset * size, masks + (mask_offset + mask_count) * size)
            inputs = masks + len(self.mask_positions) * size
            self._verify(self.bin_path, inputs + mask_offset * size, inputs + (mask_offset + mask_count) * size)
        tokens = self.tokens[offset:offset + length]
        if self.vocab_size is not None and int(tokens.max()) >= self.vocab_size:
            raise self._damaged(i, f"token id {int(tokens.max())} is outside the vocabulary of {self.vocab_size}")
        return (tokens, a_length, sop_label,
                self.mask_positions[mask_offset:mask_offset + mask_count],
                self.mask_inputs[mask_offset:mask_offset + mask_count])
