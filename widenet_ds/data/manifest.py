"""A prepared data folder's `manifest.json` (`widenet-ds prepare-data` writes it last, once every shard is
complete), typed: `Manifest`, read by `read_manifest` through widenet_ds/formats.py (kind "manifest").

    {"format_version": 1, "seq_length", "vocab_size", "dtype" (of the token ids), "masking" ("static" or
     "dynamic"), "max_predictions_per_seq", "masked_lm_prob", "max_ngram", "seed", "tokenizer_sha256",
     "settings_sha256", "settings" (prepare_settings.json's), "splits": {"train" (, "valid"): {"examples",
     "tokens", "shards": [{"name", "examples", "tokens", "masks", checksums}]}}, "summary": {"counts", "skipped",
     "seconds"}}

A shard entry is the shard's own `.json` meta (data/shards.py reads it); entries of shards written before the
`.idx.npy` was checksummed lack its checksum keys, which the shard checks then skip.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from widenet_ds.errors import DataError, WideNetError
from widenet_ds.formats import load_json, read_json, upgrade

MANIFEST_FILE = "manifest.json"
MANIFEST = "manifest"  # its kind in widenet_ds/formats.py
# A run's output folder passed as data: its settings file (widenet_ds/run_folder.py names it; data/ sits below
# run_folder.py and names it here too) records the data the run trained on.
RUN_CONFIG_FILE = "run_config.json"


@dataclass(frozen=True)
class Split:
    """One split of the prepared examples."""

    examples: int
    tokens: int
    shards: list[dict[str, Any]]  # each shard's name, counts and checksums, in order


@dataclass(frozen=True)
class Manifest:
    seq_length: int
    vocab_size: int
    dtype: str                 # of the token ids in the shards
    masking: str               # "static" (masks stored in the shards) or "dynamic"
    max_predictions_per_seq: int
    masked_lm_prob: float
    max_ngram: int
    seed: int
    tokenizer_sha256: str      # of the folder's tokenizer.json the shards were built with
    settings_sha256: str       # of `settings`: a shard built with other settings is rebuilt
    settings: dict[str, Any]
    splits: dict[str, Split]   # "train", and "valid" when the data has a held-out split
    summary: dict[str, Any]    # what prepare-data counted and skipped, and how long it took

    @classmethod
    def from_json(cls, data: Any, where: Path) -> Manifest:
        """A manifest.json's object (of any version) -> the current shape; a missing entry is one error naming it."""
        data = upgrade(MANIFEST, data, where)
        missing = [f.name for f in fields(cls) if f.name not in data]
        splits = data.get("splits")
        if not missing and not (isinstance(splits, dict) and all(
                isinstance(s, dict) and {"examples", "tokens", "shards"} <= set(s) for s in splits.values())):
            missing = ["splits.<split>.examples / tokens / shards"]
        if missing:
            raise DataError(f"{where} lacks {', '.join(missing)}; the manifest is damaged: re-run `widenet-ds "
                            f"prepare-data` with the same arguments")
        values = {f.name: data[f.name] for f in fields(cls)}
        values["splits"] = {name: Split(s["examples"], s["tokens"], s["shards"]) for name, s in splits.items()}
        return cls(**values)


def _trained_on(run_dir: Path) -> str:
    """The --data a run folder records, as " (DATA)"; "" when it records none (image datasets) or cannot be read."""
    try:
        data = read_json("run_config", run_dir / RUN_CONFIG_FILE).get("data")
    except WideNetError:
        return ""
    return f" ({data})" if isinstance(data, str) else ""


def read_manifest(data_dir: Path) -> Manifest:
    """The manifest of a finished data folder (it is written only after every shard is complete)."""
    path = Path(data_dir) / MANIFEST_FILE
    if not Path(data_dir).is_dir():
        raise DataError(f"data folder {str(data_dir)!r} does not exist; run `widenet-ds prepare-data --output "
                        f"{data_dir} ...` first")
    if not path.is_file() and (Path(data_dir) / RUN_CONFIG_FILE).is_file():
        raise DataError(f"{data_dir} is a training run's output folder ({RUN_CONFIG_FILE}), not a data folder of "
                        f"`widenet-ds prepare-data`: pass the data folder the run trained on"
                        f"{_trained_on(Path(data_dir))}; `widenet-ds verify {data_dir}` checks the run's checkpoints.")
    if not path.is_file():
        raise DataError(f"{data_dir} has no {MANIFEST_FILE}: the preparation did not finish (or this is not a "
                        "prepared data folder); re-run `widenet-ds prepare-data` with the same arguments to "
                        "complete it")
    return Manifest.from_json(load_json(path, DataError, "re-run `widenet-ds prepare-data`"), path)
