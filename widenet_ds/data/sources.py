"""Document sources: plain text, JSON lines, Parquet, HF `datasets`, and their weighted mix.

Every source is an iterable of documents (`str`), streamed: nothing holds the corpus in memory.
Records that cannot be used (invalid UTF-8, a malformed JSON line, a missing text field) are skipped
and counted in `SkipCounter` so the prepare summary can report them with their reason.

Weights: a source with weight w contributes each of its documents floor(w) times plus once more with
probability frac(w) (so 0.5 keeps about half, 2 duplicates). The draws come from a generator seeded
by (seed, source index), so the mix depends only on the seed, never on the number of workers.
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from widenet_ds.errors import DataError

TEXT_SUFFIXES = (".txt", ".text", ".tokens", ".raw")
JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)

# Short names for the two corpora of the paper. BookCorpus rows are single sentences without book
# boundaries, so consecutive rows are grouped into pseudo-documents to give SOP its sentence pairs.
# `datasets` builders that read local files (`data_files`), not the hub.
HF_LOCAL_BUILDERS = ("json", "parquet", "csv", "text", "arrow")
HF_ALIASES: dict[str, dict] = {
    "wikipedia": {"name": "wikimedia/wikipedia", "config": "20231101.en"},
    "bookcorpus": {"name": "bookcorpus/bookcorpus", "config": None, "rows_per_document": 256},
}


class SkipCounter(collections.Counter):
    """reason -> number of skipped records (merged across sources and workers)."""


@dataclass(frozen=True)
class TextSource:
    """A .txt file or a folder of them (recursively, sorted). One document per blank-line block,
    or per file with `document_per_file`."""

    path: Path
    document_per_file: bool = False

    def files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        files = sorted(p for p in self.path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not files:
            raise DataError(f"{self.path}: folder holds no text files ({', '.join(TEXT_SUFFIXES)}); "
                            "point --source at a file or a folder of text files")
        return files

    def documents(self, skipped: SkipCounter) -> Iterator[str]:
        for file in self.files():
            _refuse_binary(file)
            yield from _text_file_documents(file, self.document_per_file, skipped)


# Signatures of files that are not text but are easily passed as --source by mistake.
_BINARY_MAGIC = {b"\x1f\x8b": "gzip-compressed", b"PK\x03\x04": "a zip archive", b"BZh": "bzip2-compressed",
                 b"\xfd7zXZ": "xz-compressed", b"(\xb5/\xfd": "zstd-compressed", b"PAR1": "a Parquet file",
                 b"\x89PNG": "a PNG image", b"%PDF": "a PDF"}


def _refuse_binary(file: Path) -> None:
    """A binary file is not skipped document by document (that reads as "empty text"): it is named."""
    with open(file, "rb") as handle:
        head = handle.read(8192)
    kind = next((name for magic, name in _BINARY_MAGIC.items() if head.startswith(magic)), None)
    if kind is None and b"\x00" in head:
        kind = "binary (it holds NUL bytes)"
    if kind is not None:
        raise DataError(f"source file {file} is {kind}, not text; --source takes UTF-8 text files, .jsonl or "
                        ".parquet (decompress or convert the file first)")


def _text_file_documents(file: Path, whole_file: bool, skipped: SkipCounter) -> Iterator[str]:
    # Read bytes and decode per document so one bad byte costs one document, not the file.
    with open(file, "rb") as handle:
        block: list[bytes] = []
        for line in handle:
            if not whole_file and not line.strip():
                if block:
                    yield from _decode(block, skipped)
                    block = []
                continue
            block.append(line)
        if block:
            yield from _decode(block, skipped)


def _decode(lines: list[bytes], skipped: SkipCounter) -> Iterator[str]:
    try:
        text = b"".join(lines).decode("utf-8")
    except UnicodeDecodeError:
        skipped["document with non-UTF-8 bytes"] += 1
        return
    if text.strip():
        yield text


@dataclass(frozen=True)
class JsonlSource:
    """One JSON object per line; the document is `text_field`."""

    path: Path
    text_field: str = "text"

    def documents(self, skipped: SkipCounter) -> Iterator[str]:
        with open(self.path, "rb") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (UnicodeDecodeError, json.JSONDecodeError):
                    skipped["malformed JSON line"] += 1
                    continue
                yield from _record_text(record, self.text_field, skipped)


def _record_text(record: object, text_field: str, skipped: SkipCounter) -> Iterator[str]:
    text = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        skipped[f"record without a string {text_field!r} field"] += 1
    elif text.strip():
        yield text
    else:
        skipped["empty document"] += 1


@dataclass(frozen=True)
class ParquetSource:
    """A Parquet file; the document is column `text_field`. Read in record batches."""

    path: Path
    text_field: str = "text"

    def documents(self, skipped: SkipCounter) -> Iterator[str]:
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(self.path)
        if self.text_field not in parquet.schema_arrow.names:
            raise DataError(f"{self.path}: no column {self.text_field!r} (columns: "
                            f"{parquet.schema_arrow.names}); pass --text-field")
        for batch in parquet.iter_batches(batch_size=1024, columns=[self.text_field]):
            for text in batch.column(0).to_pylist():
                yield from _record_text({self.text_field: text}, self.text_field, skipped)


@dataclass(frozen=True)
class HFSource:
    """A dataset loaded with HF `datasets` in streaming mode (needs a network for hub datasets).

    Kept thin on purpose: `load_dataset(...)` and a loop over records. Tests run this same code with
    the `parquet`/`json` builders on local files.
    """

    name: str
    config: str | None = None
    split: str = "train"
    text_field: str = "text"
    rows_per_document: int = 1
    data_files: str | None = None

    def check_reachable(self) -> None:
        """Before anything is written: a hub dataset needs the hub (or HF's offline mode and its cache);
        offline, `datasets` would retry for half a minute and end in a ConnectionError traceback."""
        if (self.name in HF_LOCAL_BUILDERS or Path(self.name).exists() or os.environ.get("HF_DATASETS_OFFLINE") == "1"
                or os.environ.get("HF_HUB_OFFLINE") == "1"):
            return
        endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        try:
            socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=10).close()
        except OSError as err:
            raise DataError(f"--source hf:{self.name} needs the HF hub ({endpoint.hostname}), which cannot be reached "
                            f"from here ({err.strerror or err}). Pass the dataset's files instead (--source PATH: text, "
                            f".jsonl or .parquet), or set HF_DATASETS_OFFLINE=1 to read a copy already in the HF "
                            f"cache.") from None

    def documents(self, skipped: SkipCounter) -> Iterator[str]:
        import datasets

        try:
            dataset = datasets.load_dataset(self.name, self.config, split=self.split, streaming=True,
                                            data_files=self.data_files)
        except (OSError, ValueError) as err:  # ConnectionError, DatasetNotFoundError, a wrong config name
            raise DataError(f"--source hf:{self.name}: HF datasets could not open it ({type(err).__name__}: "
                            f"{str(err)[:300]}); check the name (and @CONFIG), or pass the dataset's files.") from None
        group: list[str] = []
        for record in dataset:
            for text in _record_text(record, self.text_field, skipped):
                group.append(text)
                if len(group) == self.rows_per_document:
                    yield "\n".join(group)
                    group = []
        if group:
            yield "\n".join(group)


@dataclass(frozen=True)
class WeightedSource:
    source: object  # any of the sources above, or DefaultCorpusSource
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise DataError(f"source weight must be a positive number, got {self.weight}")


def parse_source(spec: str, text_field: str = "text", document_per_file: bool = False) -> WeightedSource:
    """`PATH[:WEIGHT]` or `hf:NAME[@CONFIG][:WEIGHT]` -> a WeightedSource. Checks paths exist."""
    body, weight = spec, 1.0
    head, sep, tail = spec.rpartition(":")
    if sep and head:
        try:
            weight, body = float(tail), head
        except ValueError:
            pass
    if body.startswith("hf:"):
        name, _, config = body[3:].partition("@")
        options = dict(HF_ALIASES.get(name, {"name": name, "config": None}))
        if config:
            options["config"] = config
        return WeightedSource(HFSource(text_field=text_field, **options), weight)
    path = Path(body).expanduser().resolve()
    if not path.exists() and sep and head:
        if Path(head).expanduser().exists():
            raise DataError(f"source {spec!r}: weight {tail!r} is not a number; write PATH:WEIGHT with a positive "
                            f"number, e.g. {head}:2 (repeat the documents twice) or {head}:0.5 (half of them)")
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", head):
            raise DataError(f"source {spec!r}: {head + ':'!r} is not a kind of source widenet-ds reads; pass a local "
                            "path (PATH[:WEIGHT]: a text file or folder, .jsonl, .parquet) or hf:NAME[@CONFIG] "
                            "for a HF dataset")
    if not path.exists():
        raise DataError(f"source {str(path)!r} does not exist; pass an existing file or folder "
                        "(text, .jsonl or .parquet) or hf:NAME for a HF dataset")
    if path.is_dir() or path.suffix not in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        return WeightedSource(TextSource(path, document_per_file), weight)
    if path.suffix in JSONL_SUFFIXES:
        return WeightedSource(JsonlSource(path, text_field), weight)
    return WeightedSource(ParquetSource(path, text_field), weight)


@dataclass
class DocumentStream:
    """All sources in order, each document repeated according to its source's weight."""

    sources: list[WeightedSource]
    seed: int
    skipped: SkipCounter = field(default_factory=SkipCounter)

    def __iter__(self) -> Iterator[str]:
        return (text for _, text in self.numbered())

    def numbered(self) -> Iterator[tuple[int, str]]:
        """(position of the document in its source, text); the copies of a document share it."""
        for index, weighted in enumerate(self.sources):
            rng = random.Random(f"mix/{self.seed}/{index}")
            whole, fraction = divmod(weighted.weight, 1.0)
            before = SkipCounter(self.skipped)
            position = -1
            for position, document in enumerate(weighted.source.documents(self.skipped)):
                copies = int(whole) + (1 if fraction and rng.random() < fraction else 0)
                for _ in range(copies):
                    yield position, document
            if position < 0:
                _refuse_empty_source(weighted.source, SkipCounter(self.skipped) - before)


def _refuse_empty_source(source: object, skipped: SkipCounter) -> None:
    """A source that gave no document at all is an error naming why (never a silent "empty text" later)."""
    name = getattr(source, "path", None) or getattr(source, "name", None) or type(source).__name__
    if not skipped:
        raise DataError(f"source {name} is empty (or only blank lines), so the sources hold no documents from it; "
                        "remove it or fix the file")
    reasons = ", ".join(f"{count} x {reason}" for reason, count in skipped.most_common())
    hint = ""
    if any("field" in reason for reason in skipped):
        hint = " Pass --text-field with the name of the field that holds the text."
    elif any("UTF-8" in reason for reason in skipped):
        hint = " Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)."
    elif any("JSON" in reason for reason in skipped):
        hint = " Each line of a .jsonl file must be one JSON object."
    raise DataError(f"source {name} gave no usable document: every record was skipped ({reasons}).{hint}")
