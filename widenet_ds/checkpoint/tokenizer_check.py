"""Which tokenizer belongs to a checkpoint, and refusing any other.

A pretraining checkpoint records the SHA-256 of the `tokenizer.json` its data was built with
(`widenet_checkpoint.json` -> `data_manifest.tokenizer_sha256`); an exported folder records it in its
provenance and carries the file. The reference is the tokenizer saved with the checkpoint, verified
against that record. A tokenizer offered for the checkpoint (`convert --tokenizer`, finetuning's
`--tokenizer`) must have the same vocabulary (token -> id) as the reference, or, when no verified
reference file exists, the recorded file hash. Another vocabulary of the same size would silently map
every word to an embedding trained for another word.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from widenet_ds.checkpoint.source import CheckpointSource
from widenet_ds.data.tokenizer import TOKENIZER_FILE, load_tokenizer
from widenet_ds.errors import CheckpointError, WideNetError
from widenet_ds.fs.checksums import file_sha256


@dataclass(frozen=True)
class CheckpointTokenizer:
    """What a checkpoint says about its tokenizer."""

    source: str                       # the checkpoint, as named to the user
    recorded_sha256: str | None       # SHA-256 of the tokenizer.json it was trained with, if recorded
    record: str                       # where that record lives (for messages)
    reference: Path | None            # a tokenizer file saved with it that matches the record (or, with no
                                      # record, the one saved with it)


def vocabulary_sha256(tokenizer: Tokenizer) -> str:
    """Content hash of a tokenizer's vocabulary (token -> id), independent of the file's formatting."""
    vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def checkpoint_tokenizer(source: CheckpointSource) -> CheckpointTokenizer:
    """The record and the verified reference file of an opened checkpoint (its config or marker is not read
    again)."""
    if source.is_folder:
        recorded = (source.folder_config.get("provenance") or {}).get("tokenizer_sha256")
        record = f"{source.where} (provenance.tokenizer_sha256)"
    else:
        recorded = source.meta.tokenizer_sha256 if source.meta else None
        record = f"{source.where} (data_manifest.tokenizer_sha256)"
    candidates = source.tokenizer_files().paths
    reference = None
    for path in candidates:
        if path.name == TOKENIZER_FILE and (recorded is None or file_sha256(path) == recorded):
            reference = path
            break
    if reference is None and recorded is None and candidates:
        reference = candidates[0]
    return CheckpointTokenizer(str(source.given), recorded, record, reference)


def saved_tokenizer_problem(info: CheckpointTokenizer) -> str | None:
    """Why the tokenizer files saved with a checkpoint cannot be trusted (None: they can, or none exist)."""
    if info.recorded_sha256 is None or info.reference is not None:
        return None
    return (f"the checkpoint {info.source} was trained with the tokenizer of SHA-256 {info.recorded_sha256[:12]}... "
            f"(recorded in {info.record}), but no tokenizer.json saved with it has that hash (the run folder's "
            "tokenizer files were replaced or removed)")


def check_tokenizer_for_checkpoint(tokenizer: Tokenizer, given: str, info: CheckpointTokenizer,
                                   vocab_size: int | None = None, given_file: Path | None = None) -> None:
    """Refuse `tokenizer` (named `given` in messages) unless it is the checkpoint's. `given_file`: the
    tokenizer.json it was read from, compared by hash when no reference file exists."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab_size is not None and size != vocab_size:
        raise CheckpointError(f"{given} has {size} tokens but the checkpoint {info.source} has embeddings for "
                              f"{vocab_size}; use the tokenizer the checkpoint was pretrained with (the data folder "
                              "of its run, or the tokenizer files saved next to it).")
    if info.reference is not None:
        if given_file is not None and given_file.resolve() == info.reference.resolve():
            return  # the checkpoint's own tokenizer file, verified against its record: nothing to compare
        try:
            reference = load_tokenizer(info.reference)
        except WideNetError:
            reference = None
        if reference is not None and vocabulary_sha256(reference) != vocabulary_sha256(tokenizer):
            mine = reference.get_vocab()
            other = tokenizer.get_vocab()
            differing = sorted(t for t in set(mine) ^ set(other))[:5] or sorted(
                t for t in mine if mine[t] != other.get(t))[:5]
            raise CheckpointError(f"{given} is not the tokenizer of the checkpoint {info.source}: its vocabulary "
                                  f"differs from {info.reference} (verified against {info.record}), e.g. tokens "
                                  f"{differing}; pass the tokenizer the checkpoint was pretrained with.")
        return
    if info.recorded_sha256 is not None and given_file is not None and given_file.name == TOKENIZER_FILE:
        given_sha = file_sha256(given_file)
        if given_sha != info.recorded_sha256:
            raise CheckpointError(f"{given} (SHA-256 {given_sha[:12]}...) is not the tokenizer the checkpoint "
                                  f"{info.source} was trained with (SHA-256 {info.recorded_sha256[:12]}..., recorded "
                                  f"in {info.record}); pass the tokenizer.json of the data folder the run was "
                                  "trained on.")


def check_checkpoint_tokenizer(tokenizer: Tokenizer, tokenizer_source: str, checkpoint: CheckpointSource,
                               vocab_size: int | None = None, tokenizer_file: str | Path | None = None) -> None:
    """The one call for "is this the tokenizer of that checkpoint?" (finetuning, a new pretraining phase).

    tokenizer: the loaded tokenizer; tokenizer_source: how the user named it (e.g. "--tokenizer data/p1");
    checkpoint: the weights' source, opened; vocab_size: the checkpoint's embedding rows; tokenizer_file: the
    tokenizer.json it was read from, if any (compared by hash when the checkpoint's own tokenizer file is gone).
    """
    check_tokenizer_for_checkpoint(tokenizer, tokenizer_source, checkpoint_tokenizer(checkpoint), vocab_size,
                                   given_file=Path(tokenizer_file) if tokenizer_file else None)
