"""The checkpoint marker (`widenet_checkpoint.json`): written and read back whole, markers of earlier versions
mapped, damaged ones named, and marker.py the only module that opens the file."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from widenet_ds.checkpoint.marker import META_FILE, CheckpointMeta, check_marker, config_sha256
from widenet_ds.errors import CheckpointError

PACKAGE = Path(__file__).resolve().parents[2] / "widenet_ds"
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
    assert on_disk["format_version"] == 1 and on_disk["model_config_sha256"] == config_sha256(MODEL)
    assert meta.tokenizer_sha256 == "cd"


def test_the_entries_of_earlier_versions_are_mapped(tmp_path):
    # before 0.2 ep_size sat in the model config; text classifiers recorded num_labels, runs their data folder
    (tmp_path / META_FILE).write_text(json.dumps({
        "step": 5, "samples": 10, "world_size": 1, "model_config": {**MODEL, "moe": {"num_experts": 4, "ep_size": 2}},
        "num_labels": 3, "tokenizer_dir": "/runs/tok", "data_dir": "/data/phase1"}))
    meta = CheckpointMeta.read(tmp_path)
    assert (meta.ep_size, meta.deepspeed_config, meta.architecture, meta.files) == (2, {}, None, {})
    assert meta.num_labels == 3
    assert meta.tokenizer_folders == [Path("/runs/tok"), Path("/data/phase1")]
    assert meta.tokenizer_sha256 is None


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


def marker_file_uses(path: Path) -> list[str]:
    """Where a module names the marker's file to open, parse or write it: the file name as a string, or
    META_FILE inside a call that reads or writes (naming it in a message or an is_file() test is fine)."""
    tree = ast.parse(path.read_text(), str(path))
    io_calls = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "load", "loads",
                "atomic_write_json", "atomic_write_text"}
    uses = [f"{path.name}:{node.lineno} spells {META_FILE!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip("/") == META_FILE]
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name in io_calls and any(isinstance(n, ast.Name) and n.id == "META_FILE" for n in ast.walk(call)):
            uses.append(f"{path.name}:{call.lineno} {name}(... META_FILE ...)")
    return uses


def test_only_marker_py_opens_the_marker_file():
    marker = PACKAGE / "checkpoint" / "marker.py"
    elsewhere = [use for path in sorted(PACKAGE.rglob("*.py")) if path != marker for use in marker_file_uses(path)]
    assert not elsewhere, f"read and write the marker through CheckpointMeta.read/.write only: {elsewhere}"
    assert marker_file_uses(marker), "the scan finds nothing, not even marker.py's own uses"
