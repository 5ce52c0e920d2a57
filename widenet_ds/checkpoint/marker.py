"""The completion marker of a checkpoint tag, `widenet_checkpoint.json`: written last by rank 0, so a tag is
complete iff it holds one. `CheckpointMeta.read` and `.write` are its only reader and writer; markers of earlier
versions are upgraded to the current shape by widenet_ds/formats.py (kind "marker") before they are read."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from widenet_ds.data.batch_order import LOSS_PER_MICRO_BATCH, RANK_STRIDED
from widenet_ds.errors import CheckpointError
from widenet_ds.formats import VERSION_KEY, load_json, upgrade, versioned
from widenet_ds.fs.atomic import atomic_write_json
from widenet_ds.fs.checksums import FileRecords

META_FILE = "widenet_checkpoint.json"
LATEST_FILE = "latest"  # beside the tags: the newest complete one
MARKER = "marker"  # its kind in widenet_ds/formats.py
_DERIVED = (VERSION_KEY, "model_config_sha256")  # written for other readers, recomputed on every write


def config_sha256(model_config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(model_config, sort_keys=True).encode()).hexdigest()


def _parse(tag_dir: Path, required: bool) -> dict[str, Any] | None:
    """The marker's JSON object (None if absent and not `required`); the one place the file is opened."""
    path = Path(tag_dir) / META_FILE
    if not path.is_file():
        if not required:
            return None
        raise CheckpointError(f"{tag_dir} is not a complete widenet-ds checkpoint (no {META_FILE}); it is "
                              f"partial or from another program. Resume from a complete one (see "
                              f"{Path(tag_dir).parent / LATEST_FILE}).")
    data = load_json(path, CheckpointError, f"the checkpoint marker is damaged: resume from another checkpoint of "
                                            f"{Path(tag_dir).parent} (pass its tag folder to --resume)")
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a widenet-ds checkpoint marker (a JSON object); resume from another "
                              f"checkpoint of {Path(tag_dir).parent}.")
    return data


def check_marker(tag_dir: Path) -> None:
    """Refuse a tag folder without a readable marker: a partial checkpoint, or a `latest` pointing at one."""
    _parse(tag_dir, required=True)


@dataclass(frozen=True)
class CheckpointMeta:
    """The marker's entries, typed. `run` holds what the task adds (pretraining's data manifest, the image
    dataset, a finetuning seed); on disk its entries sit beside the others, as in markers of earlier versions.
    The defaults are for writers; a marker read from disk has every entry (formats.py fills those of earlier
    versions)."""

    step: int
    samples: int
    world_size: int
    ep_size: int
    model_config: dict[str, Any]
    deepspeed_config: dict[str, Any]
    architecture: str | None = None  # None: a text model's checkpoint of a version that did not record it
    #                                  (its heads tell which: portable/format.py's infer_architecture)
    task: str | None = None          # the training task ("pretrain", "glue", "squad", "classify")
    branch_schedule: str = "joint"
    optimizer_states: bool = True    # False: model states only (`widenet-ds convert reshard`)
    data_order: str = RANK_STRIDED   # which samples a rank's micro-batches held (data/batch_order.py); markers
    #                                  before the global-chunks order, which continues on any shape, are rank-strided
    shape_free_state: str | None = None  # a folder of the tag with the whole training state (`convert reshard`):
    #                                      a resume re-lays it out for its shape (checkpoint/shape_free.py)
    branch_parallel: int = 1             # ranks of a branch group (--branch-parallel); world_size counts them all
    loss_normalisation: str = LOSS_PER_MICRO_BATCH  # how a step's micro-batches weighed their per-token losses
    #                                      (data/batch_order.py): each micro-batch's own mean unless a resume onto
    #                                      another micro batch changed it to the step's counts
    files: FileRecords = field(default_factory=dict)  # every other file of the tag: size, SHA-256 ({}: not recorded)
    run: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, tag_dir: Path, *, required: bool = True) -> CheckpointMeta | None:
        """The marker of `tag_dir` (None when it has none and it is not `required`: a DeepSpeed checkpoint of
        another program, which conversion still reads)."""
        data = _parse(tag_dir, required)
        return None if data is None else cls.from_json(data, Path(tag_dir))

    def write(self, tag_dir: Path) -> Path:
        """Write the marker into `tag_dir` atomically (a reader sees no marker or a whole one)."""
        return atomic_write_json(Path(tag_dir) / META_FILE, self.to_json(), sort_keys=True)

    # -- entries only markers of earlier versions hold (in `run`) ------------------------------------------
    @property
    def num_labels(self) -> int | None:
        """Text classifiers' label count, recorded before markers named the architecture (None: not recorded)."""
        return self.run.get("num_labels")

    @property
    def tokenizer_folders(self) -> list[Path]:
        """Folders that may hold the run's tokenizer files: markers of earlier versions named them."""
        return [Path(self.run[key]) for key in ("tokenizer_dir", "data_dir") if self.run.get(key)]

    @property
    def tokenizer_sha256(self) -> str | None:
        """The SHA-256 of the tokenizer the run's prepared data was built with (pretraining's data manifest)."""
        return (self.run.get("data_manifest") or {}).get("tokenizer_sha256")

    # -- the file's shape (also kept inside other files: the shape-free state) ------------------------
    def to_json(self) -> dict[str, Any]:
        fields_ = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "run"}
        return versioned(MARKER, {**self.run, **fields_, "model_config_sha256": config_sha256(self.model_config)})

    @classmethod
    def from_json(cls, data: dict[str, Any], where: Path) -> CheckpointMeta:
        """A marker's JSON object (of any version) read from the tag folder `where`."""
        data = upgrade(MARKER, data, where / META_FILE)
        known = {f.name for f in dataclasses.fields(cls)} - {"run"}
        missing = sorted(known - set(data))
        if missing:
            raise CheckpointError(f"{where / META_FILE} lacks an entry a checkpoint marker has ({', '.join(missing)}); "
                                  f"the marker is damaged: resume from another checkpoint of {where.parent}.")
        run = {k: v for k, v in data.items() if k not in known and k not in _DERIVED}
        return cls(**{name: data[name] for name in known}, run=run)
