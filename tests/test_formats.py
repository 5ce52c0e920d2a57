"""The one table of on-disk formats (widenet_ds/formats.py): each kind's upgrade chain from version 1 (the files
older versions wrote, as their readers read them), the error for a file newer than the code and for a version
entry that is none, files without a version entry, every kind documented in docs/formats.md, and no reader or
writer that goes around the table."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import pytest

from widenet_ds.data.batch_order import RANK_STRIDED
from widenet_ds.errors import CheckpointError, DataError, RunFolderError
from widenet_ds.formats import (
    KINDS,
    MICRO_BATCH_MEANS,
    VERSION_KEY,
    Kind,
    current,
    load_json,
    read_json,
    upgrade,
    versioned,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "widenet_ds"
MODEL = {"hidden_size": 8, "moe": {"num_experts": 4, "top_k": 2}}
MICRO_AND_WORLD = {"micro_batch_size": 4, "world_size": 2}

# A file of each kind as the oldest writer of version 1 wrote it, and what its reader sees today.
OLDEST = {
    "marker": (  # before 0.2: ep_size in the model config; no DeepSpeed settings, order, checksums, ...
        {"step": 5, "samples": 10, "world_size": 2, "num_labels": 3, "tokenizer_dir": "/runs/tok",
         "model_config": {**MODEL, "activation_checkpointing": True, "moe": {**MODEL["moe"], "ep_size": 2}}},
        {"step": 5, "samples": 10, "world_size": 2, "num_labels": 3, "tokenizer_dir": "/runs/tok",
         "model_config": MODEL, "ep_size": 2, "deepspeed_config": {}, "architecture": None, "task": None,
         "branch_schedule": "joint", "optimizer_states": True, "data_order": RANK_STRIDED, "shape_free_state": None, "files": {},
         "branch_parallel": 1, "loss_normalisation": MICRO_BATCH_MEANS}),
    "folder": (  # an image folder of `python -m widenet_ds.vision.export`
        {VERSION_KEY: 1, "architecture": "ViTWideNetForImageClassification", "vision_model": MODEL,
         "provenance": {"step": 0}},
        {"architecture": "ViTWideNetForImageClassification", "model": MODEL, "provenance": {"step": 0},
         "num_labels": None, "dtype": "fp32", "files": {}}),
    "run_config": (  # finetuning before one trainer ran every task: the task's options as an object
        {"task": {"task": "SST-2", "predict_test": False}, "data": "glue/SST-2", "preset": "widenet-tiny-e4"},
        {"task": "glue", "glue_task": "SST-2", "predict_test": False, "data": "glue/SST-2",
         "preset": "widenet-tiny-e4"}),
    "results.finetune": (  # the first finetuning summary
        {"task": "SST-2", "init": "preset:x", "steps": 3, "seeds": 1, "median": {"dev": {"acc": 0.5}},
         "per_seed": [{"seed": 1, "metrics": {"dev": {"acc": 0.5}}}], "recipe": "widenet-table7"},
        {"task": "SST-2", "init": "preset:x", "steps": 3, "seeds": 1, "median": {"dev": {"acc": 0.5}},
         "per_seed": [{"seed": 1, "metrics": {"dev": {"acc": 0.5}}, "final_train_loss": None}],
         "recipe": "widenet-table7", "seed": None, "primary_metric": None, "baseline": {}, "load_report": "",
         "recipe_mismatch": [], "ep_size": None, "deepspeed": None, "max_seq_length": None}),
    "loader_state.text": (  # before the order was recorded: samples of this rank and the world size
        {"epoch": 0, "position": 12, "world_size": 2, "seed": 5, "num_examples": 40, "micro_batch_size": 4},
        {"epoch": 0, "consumed": 24, "order": RANK_STRIDED, "seed": 5, "num_examples": 40, "micro_batch_size": 4}),
    "loader_state.image": (  # micro-batches of this rank and the world size; the micro batch is the run's
        {"epoch": 1, "batch": 3, "world": 2, "seed": 7},
        {"epoch": 1, "consumed": 24, "micro_batch_size": 4, "order": "legacy", "seed": 7}),
    "loader_state.finetune": (  # micro-batches of this rank, on the run's micro batch and ranks
        {"epoch": 1, "position": 2},
        {"order": RANK_STRIDED, "epoch": 1, "micro_batch_size": 4, "consumed": 16}),
    "shape_free": (  # read from fp32 checkpoints only, the source's precision not recorded
        {"param_state": {}, "hyper": {}, "scalars": {"source": {"tag_dir": "/runs/x/step2", "zero_stage": 1}}},
        {"param_state": {}, "hyper": {}, "scalars": {"source": {"tag_dir": "/runs/x/step2", "zero_stage": 1,
                                                                "precision": "fp32"}}}),
}
# What the last writer of version 1 (before the version was raised) wrote: every entry, version 1 or none.
LAST = {
    "marker": {VERSION_KEY: 1, "step": 2, "samples": 64, "world_size": 2, "ep_size": 2, "model_config": MODEL,
               "deepspeed_config": {"train_batch_size": 32}, "architecture": "WideNetForPreTraining",
               "task": "pretrain", "branch_schedule": "joint", "optimizer_states": True, "data_order": "global-chunks",
               "shape_free_state": None, "files": {"a.pt": {"size": 1, "sha256": "ab"}},
               "data_manifest": {"tokenizer_sha256": "cd"}, "model_config_sha256": "ef"},
    "folder": {VERSION_KEY: 1, "architecture": "WideNetForPreTraining", "model": MODEL, "num_labels": None,
               "dtype": "bf16", "experts": "stored by global index", "provenance": {"trained_with_ep_size": 2},
               "files": {"model.safetensors": {"size": 1, "sha256": "ab"}}},
    "run_config": {"task": "glue", "glue_task": "SST-2", "seed": 1, "deepspeed_settings": {"train_batch_size": 32}},
    "results.finetune": {"task": "SST-2", "init": None, "steps": 2, "seed": 1, "seeds": 1, "primary_metric": "acc",
                         "median": {}, "per_seed": [], "baseline": {}, "load_report": "", "recipe": {},
                         "recipe_mismatch": [], "ep_size": 1, "deepspeed": None, "max_seq_length": 64},
    "loader_state.text": {"order": "global-chunks", "epoch": 1, "consumed": 32, "seed": 5, "num_examples": 40,
                          "micro_batch_size": 4, "global_batch": 16},
    "loader_state.image": {"epoch": 1, "consumed": 32, "seed": 7, "micro_batch_size": 4, "order": "global-chunks"},
    "loader_state.finetune": {"order": "global-chunks", "epoch": 1, "consumed": 32, "micro_batch_size": 4},
    "shape_free": {VERSION_KEY: 1, "param_state": {"a": {"step": 2}}, "hyper": {"a": {"lr": 0.1}},
                   "scalars": {"global_steps": 2, "source": {"tag_dir": "/runs/x/step2", "world_size": 2, "ep_size": 2,
                                                             "zero_stage": 1}}},
}
# What those files gain from later versions (what their writers did not record yet); else nothing.
GAINED = {
    "marker": lambda data: {**data, "branch_parallel": 1, "loss_normalisation": MICRO_BATCH_MEANS},
    "shape_free": lambda data: {**data, "scalars": {**data["scalars"], "source": {**data["scalars"]["source"],
                                                                                  "precision": "fp32"}}},
}
UPGRADED = sorted(name for name, kind in KINDS.items() if kind.current > 1)


def assume(kind: str) -> dict:
    return {name: MICRO_AND_WORLD[name] for name in KINDS[kind].assumes}


def test_each_upgraded_kind_has_its_oldest_and_last_version_one_files_here():
    assert sorted(OLDEST) == sorted(LAST) == UPGRADED


@pytest.mark.parametrize("kind", UPGRADED)
def test_the_oldest_files_upgrade_to_what_their_readers_read(kind):
    old, today = OLDEST[kind]
    before = copy.deepcopy(old)
    assert upgrade(kind, old, "old.json", assume=assume(kind)) == {**today, VERSION_KEY: current(kind)}
    assert old == before  # the file as read is left as it is


@pytest.mark.parametrize("kind", UPGRADED)
def test_the_last_files_of_version_one_read_as_they_were_written(kind):
    """Files written just before the version was raised (format_version 1, or none) keep every value (and gain
    what later versions record)."""
    written = LAST[kind]
    read = GAINED.get(kind, lambda data: data)(written)
    assert upgrade(kind, written, "last.json", assume=assume(kind)) == {**read, VERSION_KEY: current(kind)}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_upgraded_file_upgrades_to_itself_and_writers_write_the_current_version(kind):
    data = versioned(kind, {"step": 1})
    assert data == {VERSION_KEY: current(kind), "step": 1} and next(iter(data)) == VERSION_KEY
    assert upgrade(kind, data, "x.json") is data
    if kind in LAST:
        once = upgrade(kind, LAST[kind], "x.json", assume=assume(kind))
        assert upgrade(kind, once, "x.json") == once


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_file_without_a_version_is_of_version_one(kind):
    data = copy.deepcopy(OLDEST[kind][0]) if kind in OLDEST else {"step": 1}
    data.pop(VERSION_KEY, None)
    assert KINDS[kind].unversioned == 1
    assert upgrade(kind, data, "x.json", assume=assume(kind)) == upgrade(kind, {**data, VERSION_KEY: 1}, "x.json",
                                                                         assume=assume(kind))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_file_newer_than_this_code_is_one_error_naming_file_version_newest_and_fix(kind):
    newer = current(kind) + 1
    with pytest.raises(KINDS[kind].error) as raised:
        upgrade(kind, {VERSION_KEY: newer}, "/runs/x/file.json")
    message = str(raised.value)
    assert message.startswith(f"/runs/x/file.json ({KINDS[kind].what}) is of format version {newer}, newer than")
    assert f"up to version {current(kind)}" in message and "a newer widenet-ds wrote it" in message
    assert "pip install --upgrade widenet-ds" in message


@pytest.mark.parametrize("version, kind", [("2", "a JSON text, not a whole number"),
                                           (True, "a JSON true/false, not a whole number"), (0, "below 1"),
                                           (-1, "below 1"), (1.0, "a JSON number, not a whole number"),
                                           (None, "a JSON null, not a whole number")])
def test_a_version_entry_that_is_no_version_is_refused(version, kind):
    with pytest.raises(CheckpointError, match=rf"x.json \(checkpoint marker\) has format_version "
                                              rf"{re.escape(repr(version))}, {kind}, which is no version \(1 to 3\)"):
        upgrade("marker", {VERSION_KEY: version}, "x.json")
    with pytest.raises(RunFolderError, match=r"x.json \(the run's settings\) holds a JSON list, not an object"):
        upgrade("run_config", [], "x.json")


@pytest.mark.parametrize("task, num_labels, names", [
    ("SST-2", 2, ["negative", "positive"]), ("mnli-mm", 3, ["contradiction", "entailment", "neutral"]),
    ("SST-2", 3, None),  # another head than the dataset's: LABEL_i, as version 2's exporter gave
    ("my-reviews", 2, None), (None, 2, None)])
def test_a_text_classifier_folder_of_version_two_gains_the_label_names_its_exporter_gave(task, num_labels, names):
    folder = {VERSION_KEY: 2, "architecture": "WideNetForSequenceClassification", "model": MODEL,
              "num_labels": num_labels, "dtype": "fp32", "files": {},
              "provenance": {"seed": 1, **({"task": task} if task else {})}}
    provenance = upgrade("folder", folder, "config.json")["provenance"]
    assert provenance == {**folder["provenance"], **({"label_names": names} if names else {})}
    squad = {**folder, "architecture": "WideNetForQuestionAnswering", "num_labels": None}
    assert "label_names" not in upgrade("folder", squad, "config.json")["provenance"]


def test_a_version_written_as_text_is_said_to_be_text():
    """A hand-edited file's "3": before, only "no version (1 to 3)", as if 3 were not one."""
    with pytest.raises(CheckpointError, match=r"format_version '3', a JSON text, not a whole number, which is no "
                                              r"version \(1 to 3\) \(a number written as text: a file edited by hand "
                                              r"holds format_version 3, without quotes\)"):
        upgrade("marker", {VERSION_KEY: "3"}, "x.json")


def test_an_upgrade_that_needs_the_readers_values_says_so():
    with pytest.raises(TypeError, match=r"needs \['micro_batch_size', 'world_size'\] from its reader"):
        upgrade("loader_state.finetune", {"epoch": 0, "position": 1}, "x")


def test_a_kind_whose_upgrades_do_not_lead_to_its_version_is_refused_when_defined():
    with pytest.raises(AssertionError, match="upgrades \\[1\\] do not lead from 1 to 3"):
        Kind("x", "x", 3, CheckpointError, {1: lambda data, assume: data})


def test_read_json_names_a_missing_or_damaged_file(tmp_path):
    with pytest.raises(RunFolderError, match=r"run_config.json does not exist \(the run's settings\)"):
        read_json("run_config", tmp_path / "run_config.json")
    (tmp_path / "run_config.json").write_text("{")
    with pytest.raises(RunFolderError, match=r"run_config.json \(the run's settings\) is not valid JSON: Expecting "
                                             r"property name .* at line 1, column 2; the file is damaged: restore it or "
                                             r"start a new run in another folder\.$"):
        read_json("run_config", tmp_path / "run_config.json")
    (tmp_path / "run_config.json").write_bytes(b'{"task": "\xff"}')  # not UTF-8
    with pytest.raises(RunFolderError, match=r"\(the run's settings\) cannot be read: 'utf-8' codec .*restore it"):
        read_json("run_config", tmp_path / "run_config.json")
    (tmp_path / "run_config.json").write_text(json.dumps(OLDEST["run_config"][0]))
    assert read_json("run_config", tmp_path / "run_config.json")["task"] == "glue"
    # the one reader of any JSON file that names it: without a kind, the caller's error and fix
    (tmp_path / "any.json").write_text('{"a": 1,\n')
    with pytest.raises(DataError, match=r"any.json is not valid JSON: .* at line 2, column 1; pass another\.$"):
        load_json(tmp_path / "any.json", DataError, "pass another")
    assert load_json(tmp_path / "run_config.json", DataError) == OLDEST["run_config"][0]


def test_every_kind_is_documented_with_its_current_version():
    table = (REPO / "docs" / "formats.md").read_text()
    documented = dict(re.findall(r"^\| `([\w.]+)` \| .*? \| (\d+) \|", table, re.M))
    assert documented == {name: str(kind.current) for name, kind in KINDS.items()}


# --- nothing goes around the table ------------------------------------------------------------------------------
def test_no_module_but_formats_spells_a_format_version():
    """Writers write `versioned(kind, ...)` and readers `upgrade(kind, ...)`: no module has a version number of its
    own (FORMAT_VERSION = 1 was defined five times and never raised) or reads the entry itself."""
    spelled = [f"{path.relative_to(REPO)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
               if path.name != "formats.py" for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, (ast.Constant, ast.Name)) and (
                   getattr(node, "value", None) == VERSION_KEY or getattr(node, "id", "") == "FORMAT_VERSION")]
    assert not spelled, f"use widenet_ds/formats.py (VERSION_KEY, versioned, upgrade): {spelled}"


# Files whose one reader (and writer) is one module: the file's name may appear in an I/O call nowhere else.
OWNERS = {
    "widenet_checkpoint.json": ("META_FILE", {"checkpoint/marker.py"}),
    # data/ sits below run_folder.py: its one look into a run folder (for an error message) reads through formats
    "run_config.json": ("RUN_CONFIG_FILE", {"run_folder.py", "data/manifest.py"}),
    "manifest.json": ("MANIFEST_FILE", {"data/manifest.py", "data/prepare.py"}),  # its reader, its writer
}
IO_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "load", "loads", "read_json", "load_json",
            "atomic_write_json", "atomic_write_text", "_write_json"}


def file_uses(path: Path, name: str, constant: str) -> list[str]:
    """Where a module names the file `name` to open, parse or write it: the name as a string, or `constant`
    inside a call that reads or writes (naming it in a message or an is_file() test is fine)."""
    tree = ast.parse(path.read_text(), str(path))
    uses = [f"{path.name}:{node.lineno} spells {name!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip("/") == name]
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        called = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if called in IO_CALLS and any(isinstance(n, ast.Name) and n.id == constant for n in ast.walk(call)):
            uses.append(f"{path.name}:{call.lineno} {called}(... {constant} ...)")
    return uses


@pytest.mark.parametrize("name", sorted(OWNERS))
def test_each_file_is_opened_by_its_owners_only(name):
    constant, owners = OWNERS[name]
    found = {str(p.relative_to(PACKAGE)): file_uses(p, name, constant) for p in sorted(PACKAGE.rglob("*.py"))}
    elsewhere = [use for module, uses in found.items() if module not in owners for use in uses]
    assert not elsewhere, f"read and write {name} through {sorted(owners)} only: {elsewhere}"
    assert any(found[owner] for owner in owners), "the scan finds nothing, not even the owners' own uses"
