"""A checkpoint named on the command line (`--init-from`, `--model-config FOLDER`), resolved once per process: a
portable folder (config.json + model.safetensors) or a DeepSpeed checkpoint (a tag, its `checkpoints/` folder or
the run folder; the tag `latest` names). Opening it checks its files against their records (checkpoint/verify.py)
before any rank reads a weight; the run's checks and its weights then read this object, and nothing opens the
path's config or marker again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from widenet_ds.checkpoint.deepspeed import read_tag
from widenet_ds.checkpoint.format import (TEXT_DEFAULT, PortableCheckpoint, architecture, is_folder, read_folder,
                                          read_folder_config, stored_model_config)
from widenet_ds.checkpoint.load import tag_tokenizer_files
from widenet_ds.checkpoint.marker import META_FILE, CheckpointMeta, check_marker
from widenet_ds.checkpoint.training import resolve_tag_dir
from widenet_ds.checkpoint.verify import verify_folder, verify_tag
from widenet_ds.data.shards import MANIFEST_FILE
from widenet_ds.data.tokenizer import tokenizer_files_in
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.model.config import split_run_settings


def _is_checkpoint(source: Path) -> bool:
    return is_folder(source) or (source / "checkpoints").is_dir() or (source / "latest").is_file() \
        or any(source.glob("*_model_states.pt"))


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
    flag: str                             # which option named it ("--init-from")
    architecture: str
    stored_config: dict[str, Any] | None  # the model config as stored (run settings of old versions inside;
    #                                       None: a DeepSpeed checkpoint of another program, no marker)
    where: Path                           # the file that records it: config.json or the tag's marker
    folder_config: dict[str, Any] | None = None  # a folder's config.json (None: a DeepSpeed tag)
    meta: CheckpointMeta | None = None    # a DeepSpeed tag's marker

    @classmethod
    def open(cls, given: Path, flag: str, use_other: Callable[[Path], str] | None = None) -> CheckpointSource:
        """Resolve and verify `given`; `use_other(tag_dir)`: how the command takes another tag (default `flag`)."""
        given = Path(given)
        if given.is_dir() and not _is_checkpoint(given):
            raise ConfigError(f"{flag} {given} is a directory but not a checkpoint (no config.json, no DeepSpeed "
                              f"checkpoint){_what_else(given, flag)}.")
        if is_folder(given):
            config = read_folder_config(given)
            where = given / "config.json"
            verify_folder(given, config)
            return cls(given, flag, config.get("architecture", TEXT_DEFAULT), stored_model_config(config, where), where,
                       folder_config=config)
        tag_dir = resolve_tag_dir(given, require_marker=False)
        meta = CheckpointMeta.read(tag_dir, required=False)  # None: another program's DeepSpeed checkpoint
        verify_tag(tag_dir, meta, use_other or (lambda tag: f"{flag} {tag}"))
        return cls(given, flag, (meta.architecture if meta else None) or TEXT_DEFAULT,
                   meta.model_config if meta else None, tag_dir / META_FILE, meta=meta)

    @property
    def is_folder(self) -> bool:
        return self.folder_config is not None

    @property
    def tag_dir(self) -> Path:
        """The DeepSpeed tag folder (a folder source has none)."""
        assert not self.is_folder, f"{self.given} is a portable folder"
        return self.where.parent

    def model_config(self, config_class):
        """The model config it records, of this task's config type."""
        if self.stored_config is None:
            check_marker(self.tag_dir)  # the error of a tag without our marker, naming the fix
        arch = architecture(self.architecture, str(self.where))
        if arch.config is not config_class:
            raise CheckpointError(f"{self.flag} {self.given} holds a {arch.name}, whose {arch.config.NAME} is not this "
                                  f"task's ({config_class.NAME}); pass a checkpoint of the model this task trains.")
        try:
            return config_class.from_dict(split_run_settings(self.stored_config)[0])
        except (ConfigError, TypeError) as err:
            raise CheckpointError(f"{self.where} holds no readable {config_class.NAME} ({err}); convert the checkpoint "
                                  f"again.") from None

    def read_weights(self) -> PortableCheckpoint:
        """Every weight, experts by global index (a trainer that resumes a tag's full state loads it into the
        engine with DeepSpeed instead)."""
        if self.is_folder:
            return read_folder(self.given, config=self.folder_config)
        return read_tag(self.tag_dir, self.meta)

    def tokenizer_files(self) -> tuple[Path, ...]:
        """The tokenizer saved with it: a folder's own files; a tag's run folder's, else its data folder's."""
        return tokenizer_files_in(self.given) if self.is_folder else tag_tokenizer_files(self.tag_dir, self.meta)
