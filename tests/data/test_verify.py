"""Issue 16, items 2 and 7: prepare-data never writes into a foreign folder; damaged shards are found
(at open, on first touch, by `verify-data`) with an error naming the file, and a re-run repairs them."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from widenet_ds.cli import main as widenet_ds
from widenet_ds.data.loader import PretrainingDataLoader
from widenet_ds.data.prepare import cli as prepare_cli
from widenet_ds.data.verify import verify_data
from widenet_ds.errors import DataError


def prepare_args(shared_data: Path, output: Path) -> list[str]:
    return ["--source", str(shared_data / "corpus/books/pg11.txt"), "--tokenizer",
            str(shared_data / "vocab/bert-base-uncased-vocab.txt"), "--seq-length", "64", "--partition-mb", "0.05",
            "--valid-fraction", "0.05", "--output", str(output), "--workers", "1", "--no-progress", "--seed", "3"]


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "manifest.json"}


@pytest.fixture(scope="module")
def pristine(shared_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("integrity") / "data"
    assert prepare_cli(prepare_args(shared_data, out)) == 0
    return out


@pytest.fixture
def data(pristine, tmp_path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(pristine, copy)
    return copy


def read_all(data: Path) -> None:
    loader = PretrainingDataLoader(data, 8, dynamic_masking=True)
    for _, _ in zip(range(len(loader)), loader):
        pass


# --- item 2 --------------------------------------------------------------------------------------------
def test_prepare_data_refuses_a_pretraining_run_folder_and_changes_nothing(shared_data, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "tokenizer.json").write_text('{"the run": "tokenizer"}')
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = digests(run)
    assert widenet_ds(["prepare-data", *prepare_args(shared_data, run)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "not a data folder of prepare-data" in err and "metrics.jsonl" in err
    assert "new or empty --output" in err
    assert digests(run) == before and sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl",
                                                                              "tokenizer.json"]


def test_prepare_data_refuses_a_data_folder_with_foreign_files(shared_data, data, capsys):
    (data / "notes.txt").write_text("mine")
    assert widenet_ds(["prepare-data", *prepare_args(shared_data, data)]) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and "which prepare-data did not write" in err


def test_prepare_data_reruns_into_its_own_folder_and_an_empty_one(shared_data, data, tmp_path):
    before = digests(data)
    assert prepare_cli(prepare_args(shared_data, data)) == 0  # the same preparation: nothing to do
    assert digests(data) == before
    (tmp_path / "empty").mkdir()
    assert prepare_cli(prepare_args(shared_data, tmp_path / "empty")) == 0
    assert digests(tmp_path / "empty") == before


# --- item 7 --------------------------------------------------------------------------------------------
def test_manifest_records_checksums_of_every_shard_file(pristine):
    import json

    manifest = json.loads((pristine / "manifest.json").read_text())
    for entry in manifest["splits"]["train"]["shards"]:
        assert {"bin_sha256", "idx_sha256", "bin_crc32", "idx_crc32", "idx_bytes"} <= set(entry)
        assert hashlib.sha256((pristine / f"{entry['name']}.idx.npy").read_bytes()).hexdigest() == entry["idx_sha256"]
    assert verify_data(pristine)["shards"] == sum(len(s["shards"]) for s in manifest["splits"].values())


def flip_in_range_token(path: Path) -> None:
    """Change one token id into another valid id: the kind of damage a range check cannot see."""
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[len(tokens) // 2] = 1000 if tokens[len(tokens) // 2] != 1000 else 1001
    tokens.tofile(path)


def test_in_range_bit_flip_is_caught_by_the_loader_verify_data_and_repaired(shared_data, data, capsys):
    shard = data / "train" / "part-00001.bin"
    original = shard.read_bytes()
    flip_in_range_token(shard)
    with pytest.raises(DataError, match=r"part-00001\.bin is damaged.*prepare-data"):
        read_all(data)
    assert widenet_ds(["verify-data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "train/part-00001.bin" in err and "checksum" in err and "Re-run `widenet-ds prepare-data`" in err
    # The re-run repairs it, byte for byte, and says which shard it rebuilt.
    assert prepare_cli(prepare_args(shared_data, data)) == 0
    assert "rebuilding damaged shard train/part-00001" in capsys.readouterr().err
    assert shard.read_bytes() == original
    assert widenet_ds(["verify-data", str(data)]) == 0
    read_all(data)


def test_random_bytes_in_an_index_name_the_file(data, capsys):
    index = data / "train" / "part-00000.idx.npy"
    raw = bytearray(index.read_bytes())
    raw[200:264] = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    index.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"part-00000\.idx\.npy is damaged"):
        read_all(data)
    assert widenet_ds(["verify-data", str(data)]) == 2
    assert "train/part-00000.idx.npy" in capsys.readouterr().err


def test_random_bytes_in_a_legacy_shard_without_block_checksums_are_a_data_error(data):
    """Data folders of an older widenet-ds have no block CRCs: ids outside the vocabulary and index rows
    pointing outside the shard are still caught per example, naming the file (not an IndexError)."""
    import json

    manifest = json.loads((data / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            for key in ("bin_crc32", "idx_crc32", "idx_sha256", "idx_bytes"):
                entry.pop(key)
    (data / "manifest.json").write_text(json.dumps(manifest))
    shard = data / "train" / "part-00000.bin"
    shard.write_bytes(np.full(shard.stat().st_size // 2, 65000, dtype=np.uint16).tobytes())
    with pytest.raises(DataError, match=r"part-00000\.bin .*outside the vocabulary of 30522"):
        read_all(data)
