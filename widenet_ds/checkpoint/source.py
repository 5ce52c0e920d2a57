"""The one route from a path to a checkpoint: `CheckpointSource.open(path, flag, tag=..., purpose=...)` resolves a
portable folder (config.json + model.safetensors) or a DeepSpeed checkpoint (a tag, its `checkpoints/` folder or
the run folder; `tag` picks one, else the tag `latest` names) once, reads its config or marker once and checks its
files against their records (checkpoint/verify.py) before anything reads a weight. Every consumer -- a run's
`--init-from` and `--resume`, `widenet-ds convert` and `verify`, `load_pretrained`, reshard, the shape-free state,
the tokenizer check -- takes the opened object; nothing opens the path's config or marker again.

Purposes: INIT (`--init-from`, `--model-config FOLDER`: weights to start from, a folder or a tag of any program),
RESUME (`--resume`: a complete widenet-ds tag with the state to continue exactly), CONVERT (`convert`, `verify`,
`branches`, `load_pretrained`: a folder or a tag of any program, `--tag` to pick another one)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from widenet_ds.checkpoint.deepspeed import read_tag
from widenet_ds.checkpoint.marker import META_FILE, CheckpointMeta, check_marker
from widenet_ds.checkpoint.tags import check_resumable, resolve_tag_dir
from widenet_ds.checkpoint.verify import Verified, verify_folder, verify_tag
from widenet_ds.data.manifest import MANIFEST_FILE
from widenet_ds.data.tokenizer import TokenizerFiles
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.model.base import EncoderModel
from widenet_ds.portable.format import (
    TEXT_DEFAULT,
    PortableCheckpoint,
    architecture,
    check_explicit_config,
    is_folder,
    read_folder,
    read_folder_config,
    stored_model_config,
)
from widenet_ds.portable.weights import LoadReport, check_same_family, load_into

Purpose = Literal["init", "resume", "convert"]
INIT: Purpose = "init"
RESUME: Purpose = "resume"
CONVERT: Purpose = "convert"


def _is_checkpoint(source: Path) -> bool:
    return is_folder(source) or (source / "checkpoints").is_dir() or (source / "latest").is_file() \
        or any(source.glob("*_model_states.pt"))


def _use_other(purpose: Purpose, flag: str):
    """How the command at hand takes another tag of the same run (named in a damaged tag's error)."""
    if purpose == CONVERT:
        return lambda tag_dir: f"--tag {tag_dir.name}"
    return lambda tag_dir: f"{flag} {tag_dir}"


def _what_else(given: Path, flag: str) -> str:
    """What `flag` takes instead of the folder `given`, and what that folder is where it is known."""
    takes = ("a folder written by `widenet-ds convert to-folder`, a DeepSpeed checkpoint (a tag or checkpoints "
             "folder) or a run folder")
    if flag == "--model-config":
        takes = f"a preset, a model-config JSON, {takes}"
    if (given / MANIFEST_FILE).is_file():
        return (f": it is a data folder of `widenet-ds prepare-data`, which a run takes as --data (pretraining) or "
                f"--tokenizer (finetuning); {flag} takes {takes}")
    return f"; pass {takes}"


@dataclass(frozen=True)
class CheckpointSource:
    given: Path                           # as the command line named it
    flag: str                             # which option or argument named it ("--init-from", "--resume", "source")
    purpose: Purpose
    architecture: str
    stored_config: dict[str, Any] | None  # the model config as stored (None: a DeepSpeed checkpoint of another
    #                                       program, no marker)
    where: Path                           # the file that records it: config.json or the tag's marker
    verified: Verified                    # what the opening checked: its files against their records
    folder_config: dict[str, Any] | None = None  # a folder's config.json (None: a DeepSpeed tag)
    meta: CheckpointMeta | None = None    # a DeepSpeed tag's marker

    @classmethod
    def open(cls, given: str | Path, flag: str, *, tag: str | None = None,
             purpose: Purpose = INIT) -> CheckpointSource:
        """Resolve and verify `given` (named by `flag` in messages) for `purpose`."""
        given = Path(given)
        if purpose == INIT and given.is_dir() and not _is_checkpoint(given):
            raise ConfigError(f"{flag} {given} is a directory but not a checkpoint (no config.json, no DeepSpeed "
                              f"checkpoint){_what_else(given, flag)}.")
        if purpose != RESUME and is_folder(given):
            if tag is not None:
                raise CheckpointError(f"{given} is a checkpoint folder, which has no tags; drop the tag {tag!r}.")
            config = read_folder_config(given)
            where = given / "config.json"
            verified = verify_folder(given, config)
            return cls(given, flag, purpose, config.get("architecture", TEXT_DEFAULT),
                       stored_model_config(config, where), where, verified, folder_config=config)
        resuming = purpose == RESUME
        tag_dir = resolve_tag_dir(given, tag, require_marker=resuming)
        meta = CheckpointMeta.read(tag_dir, required=resuming)  # None: another program's DeepSpeed checkpoint
        verified = verify_tag(tag_dir, meta, _use_other(purpose, flag))
        if resuming:
            check_resumable(tag_dir, meta)
        return cls(given, flag, purpose, (meta.architecture if meta else None) or TEXT_DEFAULT,
                   meta.model_config if meta else None, tag_dir / META_FILE, verified, meta=meta)

    @property
    def is_folder(self) -> bool:
        return self.folder_config is not None

    @property
    def tag_dir(self) -> Path:
        """The DeepSpeed tag folder (a folder source has none)."""
        assert not self.is_folder, f"{self.given} is a portable folder"
        return self.where.parent

    @property
    def path(self) -> Path:
        """The folder itself, or the tag folder."""
        return self.given if self.is_folder else self.tag_dir

    def model_config(self, config_class):
        """The model config it records, of this task's config type."""
        if self.stored_config is None:
            check_marker(self.tag_dir)  # the error of a tag without our marker, naming the fix
        arch = architecture(self.architecture, str(self.where))
        if arch.config is not config_class:
            raise CheckpointError(f"{self.flag} {self.given} holds a {arch.name}, whose {arch.config.NAME} is not this "
                                  f"task's ({config_class.NAME}); pass a checkpoint of the model this task trains.")
        try:
            return config_class.from_dict(self.stored_config)
        except (ConfigError, TypeError) as err:
            raise CheckpointError(f"{self.where} holds no readable {config_class.NAME} ({err}); convert the checkpoint "
                                  f"again.") from None

    def read_weights(self, model_config: Path | None = None) -> PortableCheckpoint:
        """Every weight, experts by global index (a trainer that resumes a tag's full state loads it into the
        engine with DeepSpeed instead). `model_config`: a model-config JSON for a DeepSpeed checkpoint that does
        not record its own; where one is recorded, it must be the same."""
        if not self.is_folder:
            return read_tag(self.tag_dir, self.meta, model_config=model_config)
        checkpoint = read_folder(self.given, config=self.folder_config)
        if model_config is not None:
            check_explicit_config(checkpoint.config, model_config, str(self.where))
        return checkpoint

    def tokenizer_files(self) -> TokenizerFiles:
        """The tokenizer saved with it: a folder's own files; a tag's run folder's (pretraining copies them there),
        else the data folder its marker names."""
        if self.is_folder:
            return TokenizerFiles.in_folder(self.given)
        candidates = [self.tag_dir.parent.parent, self.tag_dir.parent] + (self.meta.tokenizer_folders if self.meta else [])
        return next((found for folder in candidates if (found := TokenizerFiles.in_folder(folder))), TokenizerFiles())


def load_pretrained(cls: type[EncoderModel], source, *, ep_size: int = 1, model_overrides: dict[str, Any] | None = None,
                    tag: str | None = None, model_config: Path | None = None,
                    **model_kwargs: Any) -> tuple[EncoderModel, LoadReport]:
    """`load_pretrained(cls, source)` -> (model, report): build `cls` with the saved config, load the weights.

    cls: any architecture of portable/format.py (text: WideNetForPreTraining, ...ForSequenceClassification,
      ...ForQuestionAnswering; images: ViTWideNetForImageClassification) of the checkpoint's family.
    source: a checkpoint folder, or a DeepSpeed checkpoint of any ep_size and world size (a tag folder, a
      checkpoints folder or a run's output folder; `tag` picks one, default the latest complete one).
    model_overrides: config fields to change (`replace`; `moe` as a dict): ones that keep the shapes (dropouts,
      `moe.capacity_factor`, ...), or the head's (`num_classes`, `pre_logits`: that head is newly initialised).
    ep_size: this run's expert parallelism (default 1: every expert in this process).
    model_config: a model-config JSON for DeepSpeed checkpoints that do not record theirs.
    model_kwargs: the model's own arguments (`num_labels` for sequence classification).
    Log `report.summary()`: what was loaded, newly initialised and left unused.
    """
    checkpoint = CheckpointSource.open(source, "source", tag=tag, purpose=CONVERT).read_weights(model_config)
    arch = architecture(cls.__name__, "the model")
    check_same_family(checkpoint, arch, str(source))
    cfg = checkpoint.config.replace(**dict(model_overrides or {}))
    if arch.takes_num_labels and arch.name == checkpoint.architecture:
        model_kwargs.setdefault("num_labels", checkpoint.num_labels)
    model = cls(cfg, ep_size=ep_size, **model_kwargs)
    return model, load_into(model, checkpoint, str(source))
