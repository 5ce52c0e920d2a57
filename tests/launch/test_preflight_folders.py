"""The preflight's folders on one rank (launch/preflight_folders.py): where its scratch folder goes (creating nothing of
the run's path), a data folder read against its checksums, missing or damaged, and the clean-up that notices a changed
run folder. An output folder node 2 does not share, and data node 2 lacks: tests/integration/test_two_nodes.py."""

from __future__ import annotations

import pytest

from tests.support.pretrain_support import prepare_data
from widenet_ds.launch.preflight_folders import (
    SCRATCH_PREFIX,
    cleanup_row,
    data_row,
    listing,
    make_scratch,
    output_row,
    scratch_parent,
)

pytestmark = pytest.mark.usefixtures("dist")
HOSTS = ["node1"]


def test_the_scratch_folder_goes_into_the_run_folder_or_the_nearest_folder_above_it(tmp_path):
    assert scratch_parent(tmp_path / "runs" / "e4") == tmp_path  # neither runs/ nor runs/e4 is created
    (tmp_path / "runs" / "e4").mkdir(parents=True)
    (tmp_path / "runs" / "e4" / "notes.txt").write_text("mine")
    before = listing(tmp_path / "runs" / "e4")
    scratch, why = make_scratch(tmp_path / "runs" / "e4")
    assert why is None and scratch.parent == tmp_path / "runs" / "e4" and scratch.name.startswith(SCRATCH_PREFIX)
    assert listing(tmp_path / "runs" / "e4") == before  # the preflight's own files are not the run's
    assert output_row(tmp_path / "runs" / "e4", scratch, None, HOSTS).passed
    assert cleanup_row(scratch, tmp_path / "runs" / "e4", before, HOSTS).passed
    assert not scratch.exists() and sorted(p.name for p in (tmp_path / "runs" / "e4").iterdir()) == ["notes.txt"]
    assert not output_row(tmp_path, None, "/x is not writable (Permission denied)", HOSTS).passed


def test_a_run_folder_changed_meanwhile_fails_the_clean_up(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    before = listing(run)
    scratch, _ = make_scratch(run)
    (run / "metrics.jsonl").write_text("{}")
    row = cleanup_row(scratch, run, before, HOSTS)
    assert not row.passed and row.found == f"--output-dir {run} changed"


def test_the_data_folder_is_read_against_its_checksums(tmp_path, shared_data):
    data = prepare_data(tmp_path / "data", [shared_data / "corpus/books/pg11.txt"])
    row, readable = data_row(data, HOSTS)
    assert readable and row.passed and "shards and the tokenizer match the manifest on every node" in row.found
    row, readable = data_row(tmp_path / "absent", HOSTS)
    assert not readable and row.found == f"--data {tmp_path / 'absent'} does not exist"
    assert f"copy the data folder to {tmp_path / 'absent'} on node1" in row.fix
    shard = next((data / "train").glob("*.bin"))
    damaged = bytearray(shard.read_bytes())
    damaged[10] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    row, readable = data_row(data, HOSTS)
    assert not readable and f"{shard}: content does not match its checksum" in row.found
    assert row.fix.startswith("Re-run `widenet-ds prepare-data` with the same arguments")
