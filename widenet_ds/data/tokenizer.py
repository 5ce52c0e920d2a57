"""BERT-style uncased WordPiece tokenizer: train one with `tokenizers`, or load `vocab.txt`/`tokenizer.json`.

The tokenizer is saved next to the prepared data (`tokenizer.json` + `vocab.txt`) and the manifest
records the SHA-256 of `tokenizer.json`, so pretraining and finetuning provably use the same one.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Iterable, Sized
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer, normalizers
from tokenizers.implementations import BertWordPieceTokenizer

from widenet_ds.data.default_corpus import DefaultCorpusSource
from widenet_ds.data.manifest import MANIFEST_FILE, Manifest, read_manifest
from widenet_ds.data.sources import DocumentStream, SkipCounter, WeightedSource, parse_source
from widenet_ds.errors import DataError
from widenet_ds.fs.atomic import atomic_write_bytes, atomic_write_text
from widenet_ds.fs.checksums import file_sha256

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILES = (TOKENIZER_FILE, VOCAB_FILE)  # what data folders, run folders and exported folders carry


@dataclass(frozen=True)
class TokenizerFiles:
    """The tokenizer files one folder holds (a prepared data folder, a run folder, an exported checkpoint folder,
    an HF folder): found, loaded, hashed and copied through this one object."""

    paths: tuple[Path, ...] = ()  # tokenizer.json first, then vocab.txt; empty: the folder holds none

    @classmethod
    def in_folder(cls, folder: str | os.PathLike) -> TokenizerFiles:
        return cls(tuple(Path(folder) / name for name in TOKENIZER_FILES if (Path(folder) / name).is_file()))

    @classmethod
    def named(cls, paths: Iterable[str | os.PathLike], option: str) -> TokenizerFiles:
        """Files named on a command line (`option`): tokenizer.json / vocab.txt, or folders holding them."""
        found: list[Path] = []
        for raw in paths:
            path = Path(raw)
            if path.is_file():
                found.append(path)
            elif path.is_dir() and (inside := cls.in_folder(path)):
                found += inside.paths
            else:
                raise DataError(f"{option} {raw}: no such file, nor a folder holding {' or '.join(TOKENIZER_FILES)}.")
        return cls(tuple(found))

    def __bool__(self) -> bool:
        return bool(self.paths)

    @property
    def json(self) -> Path | None:
        """The tokenizer.json among them (the file whose SHA-256 runs and checkpoints record)."""
        return next((path for path in self.paths if path.name == TOKENIZER_FILE), None)

    def load(self) -> Tokenizer:
        return load_tokenizer(self.paths[0])

    def sha256(self) -> str | None:
        """The SHA-256 of the tokenizer.json (None: only a vocab.txt)."""
        return file_sha256(self.json) if self.json is not None else None

    @staticmethod
    def stored_name(path: Path) -> str:
        """The name a tokenizer file gets in a folder: what every loader looks for, whatever it was called where
        it came from (e.g. bert-base-uncased-vocab.txt)."""
        return TOKENIZER_FILE if Path(path).suffix == ".json" else VOCAB_FILE

    @property
    def stored_names(self) -> list[str]:
        return [self.stored_name(path) for path in self.paths]

    def copy_into(self, folder: Path) -> None:
        """Into a run or checkpoint folder, under their stored names (each copy atomic: a reader sees the old
        file or the whole new one)."""
        for path in self.paths:
            atomic_write_bytes(Path(folder) / self.stored_name(path), path.read_bytes())


def train_tokenizer(documents: Iterable[str], vocab_size: int = 30000, min_frequency: int = 2,
                    show_progress: bool = True) -> Tokenizer:
    """Train an uncased WordPiece vocabulary (BERT normalisation: lower-case, strip accents,
    split CJK characters) over `documents`, streamed."""
    if vocab_size < 100:
        raise DataError(f"--vocab-size {vocab_size} is too small for WordPiece; use at least 100 "
                        "(BERT uses 30522, ALBERT 30000)")
    wordpiece = BertWordPieceTokenizer(lowercase=True, clean_text=True, handle_chinese_chars=True)
    # tokenizers' own bar counts against the number of documents: with a stream of unknown length it counted
    # against a total of 0; a line before and after says the same without a false total.
    length = len(documents) if isinstance(documents, Sized) else None
    if show_progress and length is None:
        print(f"training the WordPiece vocabulary ({vocab_size:,} words) over the documents", file=sys.stderr,
              flush=True)
    start = time.monotonic()
    wordpiece.train_from_iterator(documents, vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), limit_alphabet=1000,
                                  wordpieces_prefix="##", show_progress=show_progress and length is not None,
                                  length=length)
    if show_progress and length is None:
        print(f"trained the WordPiece vocabulary in {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
    tokenizer = wordpiece._tokenizer  # the plain `tokenizers.Tokenizer` inside the helper class
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise DataError("the tokenizer learned no vocabulary: the training text is empty")
    return tokenizer


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """A data folder (its `tokenizer.json`, else `vocab.txt`), a `tokenizer.json` or a `vocab.txt`."""
    path = Path(path)
    if path.is_dir() and (path / MANIFEST_FILE).is_file():
        return data_folder_tokenizer(path, read_manifest(path))
    if path.is_dir():
        for name in (TOKENIZER_FILE, VOCAB_FILE):
            if (path / name).is_file():
                return load_tokenizer(path / name)
        raise DataError(f"{path} holds neither {TOKENIZER_FILE} nor {VOCAB_FILE}; pass the data folder "
                        "written by `widenet-ds prepare-data` or a tokenizer file")
    if not path.is_file():
        raise DataError(f"tokenizer {str(path)!r} does not exist; pass a tokenizer.json, a vocab.txt or "
                        "a folder holding one")
    if path.suffix == ".json":
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
            raise DataError(f"{path} is not a valid tokenizers JSON file: {err}") from err
        vocab = set(tokenizer.get_vocab())
    else:
        try:
            with open(path, encoding="utf-8") as handle:
                vocab = {line.rstrip("\n") for line in handle}
        except UnicodeDecodeError:
            raise DataError(f"tokenizer {path} is not a vocab.txt (UTF-8 text, one token a line) nor a tokenizer.json; "
                            "pass the tokenizer file or the data folder written by `widenet-ds prepare-data`") from None
        tokenizer = None
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise DataError(f"tokenizer {path} lacks the special tokens {missing}; a BERT-style WordPiece "
                        "vocabulary needs [PAD] [UNK] [CLS] [SEP] [MASK]")
    return tokenizer or BertWordPieceTokenizer(str(path), lowercase=True)._tokenizer


def data_folder_tokenizer(data_dir: Path, manifest: Manifest) -> Tokenizer:
    """The tokenizer of a prepared data folder, checked against the hash its shards were built with (`manifest`:
    the folder's, read once by the caller)."""
    path = data_dir / TOKENIZER_FILE
    if not path.is_file():
        raise DataError(f"{path} is missing; the shards of {data_dir} need the tokenizer they were built "
                        "with: re-run `widenet-ds prepare-data`")
    if file_sha256(path) != manifest.tokenizer_sha256:
        raise DataError(f"{path} is not the tokenizer the shards of {data_dir} were built with (sha256 "
                        "differs from the manifest's tokenizer_sha256); restore that file or re-run "
                        "`widenet-ds prepare-data` with this tokenizer into a new --output")
    return load_tokenizer(path)


def save_tokenizer(tokenizer: Tokenizer, folder: Path) -> str:
    """Write `tokenizer.json` and `vocab.txt` into `folder` (atomically); return the JSON's SHA-256."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    if [index for _, index in vocab] != list(range(len(vocab))):
        raise DataError("tokenizer ids are not contiguous from 0; cannot write vocab.txt")
    atomic_write_text(folder / TOKENIZER_FILE, tokenizer.to_str(pretty=True))  # what Tokenizer.save writes
    atomic_write_text(folder / VOCAB_FILE, "".join(token + "\n" for token, _ in vocab))
    return file_sha256(folder / TOKENIZER_FILE)


# Text made only of these characters is unchanged by BERT's normaliser except for lower-casing:
# printable ASCII, tab/newline, and typographic dashes, quotes and ellipsis (no case, no accents,
# no decomposition, not control characters). `str.lower` keeps its length, so offsets stay valid.
_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e\u2010-\u2027]")


class BatchEncoder:
    """`encode_batch` without special tokens, with a shortcut for plain text.

    BERT's normaliser (clean-up, NFD accent stripping, lower-casing, CJK spacing) costs about a
    third of the tokenizer's time. For plain text (see `_NOT_PLAIN`) it reduces to `str.lower`, so
    such documents are lower-cased in Python and encoded by a copy of the tokenizer without
    normaliser; the ids are identical (tested against the full path). Other tokenizers, and any
    document with another character, take the normal path.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.plain: Tokenizer | None = None
        normalizer = tokenizer.normalizer
        if isinstance(normalizer, normalizers.BertNormalizer) and normalizer.lowercase:
            self.plain = Tokenizer.from_str(tokenizer.to_str())
            self.plain.normalizer = None

    def __call__(self, texts: list[str]) -> list[Encoding]:
        if self.plain is None:
            return self.tokenizer.encode_batch(texts, add_special_tokens=False)
        plain = [i for i, text in enumerate(texts) if _NOT_PLAIN.search(text) is None]
        if not plain:
            return self.tokenizer.encode_batch(texts, add_special_tokens=False)
        encodings: list[Encoding | None] = [None] * len(texts)
        for i, encoding in zip(plain, self.plain.encode_batch([texts[i].lower() for i in plain],
                                                              add_special_tokens=False)):
            encodings[i] = encoding
        other = [i for i, encoding in enumerate(encodings) if encoding is None]
        for i, encoding in zip(other, self.tokenizer.encode_batch([texts[i] for i in other],
                                                                  add_special_tokens=False)):
            encodings[i] = encoding
        return encodings


def cli(argv: list[str]) -> int:
    """`widenet-ds train-tokenizer`: train a WordPiece vocabulary and save it into --output."""

    parser = argparse.ArgumentParser(prog="widenet-ds train-tokenizer", description=cli.__doc__)
    parser.add_argument("--source", action="append", default=[], metavar="PATH[:WEIGHT]",
                        help="text file/folder, .jsonl, .parquet or hf:NAME[@CONFIG]; repeatable")
    parser.add_argument("--default-corpus", action="store_true",
                        help="add the embedded English corpus (needs no network)")
    parser.add_argument("--text-field", default="text", help="JSON/Parquet/HF field holding the text")
    parser.add_argument("--document-per-file", action="store_true",
                        help="a text file is one document (default: one per blank-line block)")
    parser.add_argument("--vocab-size", type=int, default=30000)
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--seed", type=int, default=12345, help="seed of the weighted source mix")
    parser.add_argument("--output", required=True, type=Path, help="folder for tokenizer.json + vocab.txt")
    args = parser.parse_args(argv)

    sources = [parse_source(spec, args.text_field, args.document_per_file) for spec in args.source]
    if args.default_corpus:
        sources.append(WeightedSource(DefaultCorpusSource()))
    if not sources:
        parser.error("give at least one --source or --default-corpus")
    skipped = SkipCounter()
    tokenizer = train_tokenizer(DocumentStream(sources, args.seed, skipped), args.vocab_size,
                                args.min_frequency)
    sha = save_tokenizer(tokenizer, args.output)
    print(f"vocabulary of {tokenizer.get_vocab_size()} tokens saved to {args.output} (sha256 {sha[:12]})")
    for reason, count in sorted(skipped.items()):
        print(f"  skipped {count} records: {reason}")
    return 0
