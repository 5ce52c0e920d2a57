"""A prepared data folder (`widenet-ds prepare-data`) opened once per process: its manifest (typed: data/manifest.py)
and its tokenizer, checked against the hash the shards were built with. The task and its loaders take this object;
none of them reads the folder's manifest or hashes its tokenizer again."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from widenet_ds.data.manifest import Manifest, read_manifest
from widenet_ds.data.tokenizer import TOKENIZER_FILE, data_folder_tokenizer


@dataclass(frozen=True)
class PreparedData:
    folder: Path
    manifest: Manifest
    tokenizer: Tokenizer

    @classmethod
    def open(cls, folder: str | os.PathLike | PreparedData) -> PreparedData:
        if isinstance(folder, PreparedData):
            return folder
        folder = Path(folder)
        manifest = read_manifest(folder)
        return cls(folder, manifest, data_folder_tokenizer(folder, manifest))

    @property
    def tokenizer_file(self) -> Path:
        return self.folder / TOKENIZER_FILE
