"""A prepared folder's manifest.json, typed (`Manifest`): read through widenet_ds/formats.py (version 1, with or
without its version entry), a damaged or newer one named, and a run folder passed as data named with the data
its run_config.json records (read through the same table)."""

from __future__ import annotations

import json

import pytest

from widenet_ds.data.manifest import MANIFEST_FILE, RUN_CONFIG_FILE, Manifest, Split, read_manifest
from widenet_ds.errors import DataError
from widenet_ds.run_folder import RUN_CONFIG_FILE as RUN_FOLDERS_NAME

SHARD = {"name": "train/part-00000", "examples": 3, "tokens": 90, "masks": 0, "bin_bytes": 180}
WRITTEN = {"format_version": 1, "seq_length": 64, "vocab_size": 1000, "dtype": "uint16", "masking": "dynamic",
           "max_predictions_per_seq": 10, "masked_lm_prob": 0.15, "max_ngram": 3, "seed": 1,
           "tokenizer_sha256": "ab", "settings_sha256": "cd", "settings": {"seed": 1},
           "splits": {"train": {"examples": 3, "tokens": 90, "shards": [SHARD]}},
           "summary": {"counts": {"documents": 2}, "skipped": {}, "seconds": 0.5}}


def write(folder, manifest) -> None:
    folder.mkdir(exist_ok=True)
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))


def test_a_manifest_reads_into_its_fields(tmp_path):
    write(tmp_path, WRITTEN)
    manifest = read_manifest(tmp_path)
    assert (manifest.seq_length, manifest.vocab_size, manifest.tokenizer_sha256) == (64, 1000, "ab")
    assert manifest.splits == {"train": Split(3, 90, [SHARD])} and "valid" not in manifest.splits
    assert manifest.summary["counts"] == {"documents": 2}
    unversioned = {k: v for k, v in WRITTEN.items() if k != "format_version"}  # (version 1 too)
    assert Manifest.from_json(unversioned, tmp_path / MANIFEST_FILE) == manifest


@pytest.mark.parametrize("damage, message", [
    (lambda m: m.pop("vocab_size"), r"manifest.json lacks vocab_size; the manifest is damaged"),
    (lambda m: m["splits"]["train"].pop("examples"), r"lacks splits.<split>.examples / tokens / shards"),
    (lambda m: m.update(format_version=2), r"\(prepared data's manifest\) is of format version 2, newer than this "
                                           r"widenet-ds reads \(up to version 1\)"),
])
def test_a_damaged_or_newer_manifest_is_one_error_naming_it(tmp_path, damage, message):
    manifest = json.loads(json.dumps(WRITTEN))
    damage(manifest)
    write(tmp_path, manifest)
    with pytest.raises(DataError, match=message):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text("{")
    with pytest.raises(DataError, match=r"manifest.json is not valid JSON"):
        read_manifest(tmp_path)


def test_a_run_folder_passed_as_data_names_the_data_its_run_trained_on(tmp_path):
    assert RUN_CONFIG_FILE == RUN_FOLDERS_NAME  # data/ names the file without importing run_folder.py
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps({"format_version": 2, "task": "pretrain", "data": "/d/phase1"}))
    with pytest.raises(DataError, match=r"training run's output folder \(run_config.json\).*trained on \(/d/phase1\);"):
        read_manifest(tmp_path)
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps({"format_version": 9, "data": "/d/phase1"}))  # unreadable here
    with pytest.raises(DataError, match=r"pass the data folder the run trained on; `widenet-ds verify"):
        read_manifest(tmp_path)
