"""The checkpoint marker (`widenet_checkpoint.json`): written (format version 3) and read back whole, markers of
versions 1 and 2 (the oldest, and the last ones written with every entry) upgraded through widenet_ds/formats.py as their
readers read them, damaged and newer ones named. (tests/test_formats.py checks that marker.py is the only module
that opens the file.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from widenet_ds.checkpoint.marker import META_FILE, CheckpointMeta, check_marker, config_sha256
from widenet_ds.errors import CheckpointError
from widenet_ds.formats import current

MODEL = {"hidden_size": 8, "moe": {"num_experts": 4}}


def test_a_marker_reads_back_as_written(tmp_path):
    meta = CheckpointMeta(step=3, samples=96, world_size=2, ep_size=2, model_config=MODEL,
                          deepspeed_config={"train_batch_size": 32}, architecture="WideNetForPreTraining",
                          task="pretrain", files={"mp_rank_00_model_states.pt": {"size": 1, "sha256": "ab"}},
                          run={"data_manifest": {"tokenizer_sha256": "cd"}})
    meta.write(tmp_path)
    assert CheckpointMeta.read(tmp_path) == meta
    on_disk = json.loads((tmp_path / META_FILE).read_text())
    # the task's entries sit beside the others; the derived ones are there for readers outside widenet-ds
    assert on_disk["data_manifest"] == {"tokenizer_sha256": "cd"} and "run" not in on_disk
    assert on_disk["format_version"] == current("marker") == 3
    assert (meta.branch_parallel, meta.loss_normalisation) == (1, "micro-batch-means")  # a new run's
    assert on_disk["model_config_sha256"] == config_sha256(MODEL)
    assert meta.tokenizer_sha256 == "cd"


def test_the_entries_of_earlier_versions_are_mapped(tmp_path):
    # before 0.2 ep_size sat in the model config; text classifiers recorded num_labels, runs their data folder
    (tmp_path / META_FILE).write_text(json.dumps({
        "step": 5, "samples": 10, "world_size": 1, "model_config": {**MODEL, "moe": {"num_experts": 4, "ep_size": 2}},
        "num_labels": 3, "tokenizer_dir": "/runs/tok", "data_dir": "/data/phase1"}))
    meta = CheckpointMeta.read(tmp_path)
    assert (meta.ep_size, meta.deepspeed_config, meta.architecture, meta.files) == (2, {}, None, {})
    assert meta.model_config == MODEL  # the run setting is out of the model config
    assert (meta.data_order, meta.optimizer_states, meta.shape_free_state, meta.branch_schedule) == (
        "rank-strided", True, None, "joint")
    assert (meta.branch_parallel, meta.loss_normalisation) == (1, "micro-batch-means")
    assert meta.num_labels == 3
    assert meta.tokenizer_folders == [Path("/runs/tok"), Path("/data/phase1")]
    assert meta.tokenizer_sha256 is None
    # written again (`convert reshard` of an old checkpoint): version 3, every entry
    meta.write(tmp_path / "again")
    assert CheckpointMeta.read(tmp_path / "again") == meta
    assert json.loads((tmp_path / "again" / META_FILE).read_text())["format_version"] == 3


@pytest.mark.parametrize("version", [1, 2])
def test_a_marker_of_an_earlier_version_with_every_entry_reads_as_written(tmp_path, version):
    """The markers written before the version was raised (format_version 1 or 2, every entry of then): the same
    values, and what version 3 added as those runs had it (no branch groups recorded, each micro-batch's own
    loss mean)."""
    meta = CheckpointMeta(step=3, samples=96, world_size=2, ep_size=2, model_config=MODEL, deepspeed_config={"a": 1},
                          architecture="WideNetForSequenceClassification", task="glue", branch_schedule="prefix",
                          optimizer_states=False, data_order="global-chunks", shape_free_state="shape_free",
                          files={"x.pt": {"size": 1, "sha256": "ab"}}, run={"seed": 7},
                          loss_normalisation="micro-batch-means")
    written = {k: v for k, v in meta.to_json().items() if k not in ("branch_parallel", "loss_normalisation")}
    (tmp_path / META_FILE).write_text(json.dumps({**written, "format_version": version}))
    assert CheckpointMeta.read(tmp_path) == meta


def test_a_marker_newer_than_this_code_is_named(tmp_path):
    (tmp_path / META_FILE).write_text(json.dumps({"format_version": 4, "step": 1}))
    with pytest.raises(CheckpointError, match=rf"{META_FILE} \(checkpoint marker\) is of format version 4, newer "
                                              r"than this widenet-ds reads \(up to version 3\).*pip install --upgrade"):
        CheckpointMeta.read(tmp_path)


def test_absent_damaged_and_incomplete_markers_are_named(tmp_path):
    assert CheckpointMeta.read(tmp_path, required=False) is None  # another program's DeepSpeed checkpoint
    with pytest.raises(CheckpointError, match=f"not a complete widenet-ds checkpoint \\(no {META_FILE}\\)"):
        CheckpointMeta.read(tmp_path)
    (tmp_path / META_FILE).write_text("{")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        check_marker(tmp_path)
    (tmp_path / META_FILE).write_text("[]")
    with pytest.raises(CheckpointError, match="not a widenet-ds checkpoint marker"):
        CheckpointMeta.read(tmp_path, required=False)
    (tmp_path / META_FILE).write_text(json.dumps({"step": 1}))
    check_marker(tmp_path)  # present and an object: the tag is complete
    with pytest.raises(CheckpointError, match="lacks an entry a checkpoint marker has"):
        CheckpointMeta.read(tmp_path)
