"""Shard files: dtype choice, round trip through the writer and the memory-mapped reader, checksums."""

from __future__ import annotations

import numpy as np
import pytest

from widenet_ds.data.shards import Shard, ShardBuilder, read_complete_meta, shard_problems, token_dtype


def test_smallest_dtype_that_holds_the_vocabulary():
    assert token_dtype(30000) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


@pytest.mark.parametrize("vocab_size", [30000, 100_000])
def test_written_shard_reads_back_and_checks_its_checksum(tmp_path, vocab_size):
    dtype = token_dtype(vocab_size)
    builder = ShardBuilder(dtype)
    builder.add([2, 70000 % vocab_size, 3, 9, 3], 3, 1, [1, 3], [4, 9])
    builder.add([2, 5, 3, 6, 7, 3], 3, 0)
    meta = builder.write(tmp_path / "part-00000", "settings", {"counts": {}})
    assert read_complete_meta(tmp_path / "part-00000", "settings") == meta
    assert read_complete_meta(tmp_path / "part-00000", "other settings") is None
    shard = Shard(tmp_path / "part-00000", meta, dtype)
    tokens, a_length, sop, positions, inputs = shard.example(0)
    assert tokens.tolist() == [2, 70000 % vocab_size, 3, 9, 3] and (a_length, sop) == (3, 1)
    assert positions.tolist() == [1, 3] and inputs.tolist() == [4, 9]
    assert shard.example(1)[0].tolist() == [2, 5, 3, 6, 7, 3] and len(shard.example(1)[3]) == 0
    assert shard_problems(tmp_path / "part-00000", meta) == []
    data = bytearray((tmp_path / "part-00000.bin").read_bytes())
    data[0] ^= 1
    (tmp_path / "part-00000.bin").write_bytes(bytes(data))
    problems = shard_problems(tmp_path / "part-00000", meta)
    assert len(problems) == 1 and "part-00000.bin" in problems[0] and "does not match its checksum" in problems[0]
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind
