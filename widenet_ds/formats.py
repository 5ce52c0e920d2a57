"""The versioned files widenet-ds writes, each kind's current version, and the upgrades that bring a file of an
older version to it: one table (as Lightning's `_migration_index`, src/lightning/pytorch/utilities/migration/
migration.py). docs/formats.md lists every kind with what each of its versions looked like.

Readers call `upgrade(kind, data, where)` (or `read_json(kind, path)`, which opens the file too) and then see the
current shape only: no reader guesses a file's age from missing keys; that knowledge lives in the upgrades
below. Writers write `versioned(kind, data)`: the current version in the file's "format_version" entry. A file
newer than this code is one error naming the file, its version and the newest this code reads. A file with no
version entry is of the kind's `unversioned` version (1: written before it recorded one).

How to add a version (the shape of a kind's file changes):
1. Raise the kind's `current` in KINDS (say 2 -> 3) and change its writer to the new shape.
2. Write the upgrade `_<kind>_2_to_3(data, assume) -> data`: a plain dict of version 2 in, one of version 3 out,
   no file access. It fills what version 2 did not record with what version 2's readers assumed, renames,
   moves. It may change its input (`upgrade` hands it a copy).
3. Register it under the version it upgrades FROM: `migrations={..., 2: _<kind>_2_to_3}`.
4. Change the reader to read version 3 only; add a version-2 example to tests/test_formats.py and a line to
   docs/formats.md.
An upgrade that has shipped never changes (files of its version exist); a fix is a new version.

`assume`: values a version did not record and its readers took from the run reading it (the loader states of
older checkpoints, which resume on their own shape only: the reader's micro batch and world size); the kinds
that need them list them in `assumes`.

Imports nothing of widenet-ds but its errors: every layer reads its files through here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from widenet_ds.errors import CheckpointError, ConfigError, DataError, RunFolderError, WideNetError

VERSION_KEY = "format_version"
Migration = Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]]

# Run settings that model configs written before widenet-ds 0.2 held (the markers and folders of then carry
# them); today they are options of a run (the flags), not part of the model.
RUN_SETTINGS = {"activation_checkpointing": "--activation-checkpointing", "ep_size": "--ep-size"}
RANK_STRIDED = "rank-strided"  # widenet_ds/data/batch_order.py's name of the order older checkpoints trained in
MICRO_BATCH_MEANS = "micro-batch-means"  # batch_order.py's name of how older runs weighed their per-token losses


def split_run_settings(model_config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a stored model-config dict without the run settings of 0.1, those settings): `activation_checkpointing`
    and `moe.ep_size`, as `{"activation_checkpointing": ..., "ep_size": ...}`."""
    model = dict(model_config)
    settings = {}
    if "activation_checkpointing" in model:
        settings["activation_checkpointing"] = model.pop("activation_checkpointing")
    moe = model.get("moe")
    if isinstance(moe, dict) and "ep_size" in moe:
        settings["ep_size"] = moe["ep_size"]
        model["moe"] = {k: v for k, v in moe.items() if k != "ep_size"}
    return model, settings


# --- the upgrades ---------------------------------------------------------------------------------------------
def _marker_1_to_2(marker: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Markers gained entries over version 1 without a new number; fill each with what its readers assumed
    when it was absent. Before 0.2 the model config held `moe.ep_size` (the ep_size then) and
    `activation_checkpointing`."""
    if isinstance(marker.get("model_config"), dict):
        marker["model_config"], settings = split_run_settings(marker["model_config"])
        marker.setdefault("ep_size", settings.get("ep_size", 1))
    for key, absent in (("deepspeed_config", {}),       # {}: not recorded
                        ("architecture", None),         # None: a text model; its heads tell which
                        ("task", None),
                        ("branch_schedule", "joint"),
                        ("optimizer_states", True),     # False only since `convert reshard --model-states-only`
                        ("data_order", RANK_STRIDED),   # recorded since the global-chunks order
                        ("shape_free_state", None),
                        ("files", {})):                 # {}: no checksums recorded
        marker.setdefault(key, absent)
    return marker


def _marker_2_to_3(marker: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Version 2 did not record the branch-parallel group size (its runs re-laid out to no branch parallelism
    only: recorded as 1, which the re-layout reads as "every rank computes every branch", true of the saved
    state) nor how its run weighed the MLM loss: every micro-batch's own mean."""
    marker.setdefault("branch_parallel", 1)
    marker.setdefault("loss_normalisation", MICRO_BATCH_MEANS)
    return marker


def _shape_free_1_to_2(state: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Version 1 was read from fp32 checkpoints only: its source's precision is fp32."""
    source = (state.get("scalars") or {}).get("source")
    if isinstance(source, dict):
        source.setdefault("precision", "fp32")
    return state


def _folder_1_to_2(config: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Image folders of `python -m widenet_ds.vision.export` held the config under "vision_model" and no
    num_labels or dtype; text folders of 0.1 kept `moe.ep_size` (the ep_size trained with) and
    `activation_checkpointing` in the model config; no folder recorded its files' checksums before
    `widenet-ds verify`."""
    if "model" not in config and "vision_model" in config:
        config["model"] = config.pop("vision_model")
    provenance = config.setdefault("provenance", {})
    if isinstance(config.get("model"), dict):
        config["model"], settings = split_run_settings(config["model"])
        if "ep_size" in settings and isinstance(provenance, dict):
            provenance.setdefault("trained_with_ep_size", settings["ep_size"])
    for key, absent in (("num_labels", None), ("dtype", "fp32"), ("files", {})):
        config.setdefault(key, absent)
    return config


# The names of the GLUE labels as version 2 of a folder's readers took them from its provenance's "task" (a GLUE
# dataset's name in any spelling), frozen here as they were: later folders record their label names themselves.
_MNLI_LABELS = ["contradiction", "entailment", "neutral"]
_GLUE_LABEL_NAMES_OF_VERSION_2 = {
    "cola": ["unacceptable", "acceptable"], "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"], "qqp": ["not_duplicate", "duplicate"], "mnli": _MNLI_LABELS,
    "mnlim": _MNLI_LABELS, "mnlimm": _MNLI_LABELS, "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"], "wnli": ["not_entailment", "entailment"], "ax": _MNLI_LABELS}


def _folder_2_to_3(config: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Version 2 did not record what a text classifier's labels mean: its exporter named them after the GLUE
    dataset its provenance's "task" names (when the number of labels fits), else LABEL_i."""
    provenance = config.get("provenance")
    task = provenance.get("task") if isinstance(provenance, dict) else None
    names = (_GLUE_LABEL_NAMES_OF_VERSION_2.get(task.lower().replace("-", "").replace("_", "")) if isinstance(task, str)
             else None)
    if (config.get("architecture") == "WideNetForSequenceClassification" and names is not None
            and config.get("num_labels") == len(names)):
        provenance.setdefault("label_names", list(names))
    return config


def _run_config_1_to_2(record: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Before one trainer ran every task, only finetuning wrote run_config.json, its task an object of the task's
    options: GLUE's {"task": name, "predict_test"}, SQuAD's {"version", "train_file", "dev_file", "doc_stride"}.
    They become the task's name and its settings of today (`glue_task` for GLUE's name); the other settings of
    that version (preset, capacity_factor, dropout, ...) stay as they were, and `widenet-ds launch --config`
    names them as settings this version does not have."""
    task = record.get("task")
    if isinstance(task, dict):
        options = dict(task)
        record["task"] = "squad" if "version" in options else "glue"
        if "task" in options:
            options["glue_task"] = options.pop("task")
        for key, value in options.items():
            record.setdefault(key, value)
    return record


def _finetune_results_1_to_2(results: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Entries after `per_seed` were added over version 1 (the first seed, the primary metric, the baseline, the
    load report, the recipe and its mismatches, ep_size, the DeepSpeed JSON, the max length), and the first
    summaries' seeds had no final train loss: absent, they are not known."""
    for key, absent in (("init", None), ("seed", None), ("primary_metric", None), ("baseline", {}),
                        ("load_report", ""), ("recipe", None), ("recipe_mismatch", []), ("ep_size", None),
                        ("deepspeed", None), ("max_seq_length", None)):
        results.setdefault(key, absent)
    for seed in results["per_seed"] if isinstance(results.get("per_seed"), list) else []:
        if isinstance(seed, dict):
            seed.setdefault("final_train_loss", None)
    return results


def _text_loader_1_to_2(state: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Before the data order was recorded: {"position": samples of this rank, "world_size": W}, rank-strided."""
    if "consumed" not in state:
        state["consumed"] = state.pop("position") * state.pop("world_size")
    state.setdefault("order", RANK_STRIDED)
    return state


def _image_loader_1_to_2(state: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Before the data order was recorded: {"batch": micro-batches of this rank, "world": W}, its epochs ending
    after whole micro-batches of every rank (the "legacy" order), its micro batch the run's."""
    if "consumed" not in state:
        micro = assume["micro_batch_size"]
        state.update(consumed=int(state.pop("batch")) * micro * int(state.pop("world")), micro_batch_size=micro,
                     order="legacy")
    return state


def _finetune_loader_1_to_2(state: dict[str, Any], assume: Mapping[str, Any]) -> dict[str, Any]:
    """Before the data order was recorded: {"epoch", "position": micro-batches of this rank}, rank-strided, on the
    run's micro batch and data-parallel ranks."""
    if "consumed" not in state:
        micro = assume["micro_batch_size"]
        state = {"order": RANK_STRIDED, "epoch": state["epoch"], "micro_batch_size": micro,
                 "consumed": int(state["position"]) * micro * assume["world_size"]}
    return state


# --- the table ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """One kind of versioned file (or of a versioned object inside another file)."""

    name: str
    what: str                  # how errors name a file of it
    current: int               # the version this code writes, and the newest it reads
    error: type[WideNetError]  # what its readers raise
    migrations: dict[int, Migration] = field(default_factory=dict)  # version v -> the upgrade v -> v + 1
    unversioned: int = 1       # the version of a file without a "format_version" entry
    assumes: tuple[str, ...] = ()  # what its upgrades take from the reader (`assume`)
    damaged: str = "restore it from a copy"  # the fix of an unreadable file

    def __post_init__(self) -> None:
        if sorted(self.migrations) != list(range(1, self.current)):
            raise AssertionError(f"{self.name}: upgrades {sorted(self.migrations)} do not lead from 1 to "
                                 f"{self.current}")


_NEW_RUN = "restore it, or run again into another folder"
KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("marker", "checkpoint marker", 3, CheckpointError, {1: _marker_1_to_2, 2: _marker_2_to_3},
         damaged="resume from another checkpoint of the run"),
    Kind("folder", "checkpoint folder's config", 3, CheckpointError, {1: _folder_1_to_2, 2: _folder_2_to_3},
         damaged="convert the checkpoint again"),
    Kind("folder_weights", "checkpoint folder's model.safetensors metadata", 1, CheckpointError),
    Kind("hf_config", "widenet-ds entry of an HF config", 1, CheckpointError),
    Kind("shape_free", "shape-free training state", 2, CheckpointError, {1: _shape_free_1_to_2}),
    Kind("loader_state.text", "pretraining data loader's state in a checkpoint", 2, CheckpointError,
         {1: _text_loader_1_to_2}),
    Kind("loader_state.image", "image data loader's state in a checkpoint", 2, CheckpointError,
         {1: _image_loader_1_to_2}, assumes=("micro_batch_size",)),
    Kind("loader_state.finetune", "finetuning data loader's state in a checkpoint", 2, CheckpointError,
         {1: _finetune_loader_1_to_2}, assumes=("micro_batch_size", "world_size")),
    Kind("model_config", "model config", 1, ConfigError, damaged="write it again (`widenet-ds model-config`)"),
    Kind("run_config", "the run's settings", 2, RunFolderError, {1: _run_config_1_to_2},
         damaged="restore it or start a new run in another folder"),
    Kind("results.pretrain", "the run's results", 1, RunFolderError, damaged=_NEW_RUN),
    Kind("results.classify", "the run's results", 1, RunFolderError, damaged=_NEW_RUN),
    Kind("results.seed", "the run's results", 1, RunFolderError, damaged=_NEW_RUN),
    Kind("results.finetune", "the run's results", 2, RunFolderError, {1: _finetune_results_1_to_2},
         damaged=_NEW_RUN),
    Kind("manifest", "prepared data's manifest", 1, DataError,
         damaged="re-run `widenet-ds prepare-data` with the same arguments"),
    Kind("data_settings", "prepared data's settings", 1, DataError,
         damaged="re-run `widenet-ds prepare-data` with --overwrite"),
    Kind("report", "report's summary", 1, ConfigError, damaged="write the report again"),
)}


def current(kind: str) -> int:
    """The version this code writes for `kind`."""
    return KINDS[kind].current


def versioned(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` as a writer writes it: the current version first, then the entries."""
    return {VERSION_KEY: KINDS[kind].current, **{k: v for k, v in data.items() if k != VERSION_KEY}}


def unversioned(data: dict[str, Any]) -> dict[str, Any]:
    """The entries of an upgraded file without its version (for readers that take every entry as content)."""
    return {k: v for k, v in data.items() if k != VERSION_KEY}


def _json_type(value: Any) -> str:
    """What JSON calls the type of a parsed value."""
    names = {type(None): "null", bool: "true/false", list: "list", str: "text", int: "number", float: "number"}
    return names.get(type(value), type(value).__name__)


def version_of(kind: str, data: Any, where: str | Path) -> int:
    """The version of a file of `kind` (its "format_version", else the kind's unversioned version); a value that
    is no version, or a version newer than this code reads, is one error naming the file."""
    spec = KINDS[kind]
    if not isinstance(data, dict):
        raise spec.error(f"{where} ({spec.what}) holds a JSON {_json_type(data)}, not an object; the file is damaged or "
                         f"of another program: {spec.damaged}.")
    version = data.get(VERSION_KEY, spec.unversioned)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        kind_of = "below 1" if isinstance(version, int) and not isinstance(version, bool) else \
            f"a JSON {_json_type(version)}, not a whole number"
        edited = (f" (a number written as text: a file edited by hand holds {VERSION_KEY} {version.strip()}, without "
                  f"quotes)" if isinstance(version, str) and version.strip().isdigit() else "")
        raise spec.error(f"{where} ({spec.what}) has {VERSION_KEY} {version!r}, {kind_of}, which is no version (1 to "
                         f"{spec.current}){edited}; the file is damaged or of another program: {spec.damaged}.")
    if version > spec.current:
        raise spec.error(f"{where} ({spec.what}) is of format version {version}, newer than this widenet-ds reads "
                         f"(up to version {spec.current}): a newer widenet-ds wrote it. Read it with that version "
                         f"(pip install --upgrade widenet-ds).")
    return version


def upgrade(kind: str, data: Any, where: str | Path, *, assume: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`data`, a file of `kind` as read, in the current shape with the current version: `data` itself when it is
    current already, else a new dict (`data` is left as it is). Idempotent: an upgraded dict upgrades to itself."""
    spec = KINDS[kind]
    version = version_of(kind, data, where)
    if version == spec.current:
        return data if data.get(VERSION_KEY) == version else {**data, VERSION_KEY: version}
    missing = [name for name in spec.assumes if name not in (assume or {})]
    if missing:
        raise TypeError(f"upgrading a {spec.what} of version {version} needs {missing} from its reader")
    data = copy.deepcopy(data)
    for step in range(version, spec.current):
        data = spec.migrations[step](data, assume or {})
    data[VERSION_KEY] = spec.current
    return data


def load_json(path: str | Path, error: type[WideNetError], fix: str = "", what: str = "") -> Any:
    """The JSON value in the file at `path`, or one `error` naming the file (and `what` it is) and what is wrong: it
    does not exist, cannot be read, or its JSON breaks at a line and column; `fix`: what to do about it. The one
    reader of a JSON file that names it (a versioned kind's: `read_json`, which upgrades it too)."""
    path = Path(path)
    named, then = (f"{path} ({what})" if what else str(path)), (f"; {fix}" if fix else "")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path} does not exist{f' ({what})' if what else ''}.") from None
    except json.JSONDecodeError as err:
        raise error(f"{named} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}{then}.") from None
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{named} cannot be read: {err}{then}.") from None


def read_json(kind: str, path: str | Path, *, assume: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A JSON file of `kind`, read and upgraded; a missing or unreadable file is one error naming it."""
    spec = KINDS[kind]
    data = load_json(path, spec.error, f"the file is damaged: {spec.damaged}", spec.what)
    return upgrade(kind, data, path, assume=assume)
