"""`widenet-ds prepare-data`: text sources -> tokenizer + sharded ALBERT examples + manifest.

The document stream is cut into partitions of about `partition_chars` characters. Partition k is
processed with its own generator seeded by (seed, k) and written as shard `part-k` of each split, so
the output is byte-identical for any number of workers: workers only change who computes a
partition, never what it contains. The main process reads the sources and keeps at most
`workers + 1` partitions in flight, so memory does not grow with the corpus.

Re-runs: the settings (sources, tokenizer, example options, seed; not the worker count) are hashed
into every shard's meta. A re-run with the same settings skips finished shards whose files match their
checksums and rebuilds (byte-identically) any other, naming it; with different settings it stops and
names the changed keys (pass --overwrite, or use a new --output). An --output that is neither empty
nor a data folder of prepare-data (e.g. a pretraining run folder) is refused: nothing else in a
folder is ever overwritten.
"""

from __future__ import annotations

import argparse
import array
import collections
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from widenet_ds.data.default_corpus import DefaultCorpusSource
from widenet_ds.data.examples import ExampleConfig, PretrainingIds, create_examples, mask_tokens
from widenet_ds.data.manifest import MANIFEST, MANIFEST_FILE, Manifest
from widenet_ds.data.sentences import sentence_spans
from widenet_ds.data.shards import (
    CHECKSUM_KEYS,
    ShardBuilder,
    read_complete_meta,
    read_shard_meta,
    shard_problems,
    token_dtype,
)
from widenet_ds.data.sources import DocumentStream, HFSource, SkipCounter, TextSource, WeightedSource, parse_source
from widenet_ds.data.tokenizer import (TOKENIZER_FILE, TOKENIZER_FILES, BatchEncoder, TokenizerFiles, load_tokenizer,
                                       save_tokenizer, train_tokenizer)
from widenet_ds.errors import DataError
from widenet_ds.formats import versioned
from widenet_ds.fs.atomic import atomic_write_json
from widenet_ds.fs.checksums import file_sha256
from widenet_ds.fs.disk_space import check_free_space, disk_full_errors
from widenet_ds.fs.run_lock import LOCK_FILE, folder_lock
from widenet_ds.fs.writable import check_output_folder as check_writable

SETTINGS_FILE = "prepare_settings.json"
# Its kind in widenet_ds/formats.py. The version is hashed with the settings into every shard's settings_sha256:
# a settings.json of another version means other shards (rebuilt with --overwrite), not an upgrade.
DATA_SETTINGS = "data_settings"
SPLITS = ("train", "valid")
# Everything prepare-data writes into --output; a folder holding anything else is not a data folder.
DATA_FOLDER_ENTRIES = frozenset({SETTINGS_FILE, MANIFEST_FILE, *TOKENIZER_FILES, *SPLITS})
# Documents per tokenizer call: big enough to amortise the call, small enough that the Rust
# encodings (tens of bytes per token) stay small.
_ENCODE_BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class PrepareConfig:
    example: ExampleConfig = field(default_factory=ExampleConfig)
    masking: str = "dynamic"
    dupe_factor: int = 1
    seed: int = 12345
    valid_fraction: float = 0.01
    partition_chars: int = 16 << 20

    def __post_init__(self) -> None:
        if self.masking not in ("static", "dynamic"):
            raise DataError(f"--masking {self.masking!r} must be 'static' or 'dynamic'")
        if self.dupe_factor < 1:
            raise DataError(f"--dupe-factor {self.dupe_factor} must be at least 1")
        if not 0.0 <= self.valid_fraction <= 0.5:
            raise DataError(f"--valid-fraction {self.valid_fraction} must be in [0, 0.5]")
        if self.partition_chars < 1024:
            raise DataError(f"partition size {self.partition_chars} characters is too small (>= 1024)")

    @property
    def valid_stride(self) -> int:
        """Every `valid_stride`-th document of each source goes to the valid split (0: none)."""
        return round(1 / self.valid_fraction) if self.valid_fraction else 0


@dataclass
class PartitionResult:
    partition: int
    metas: dict[str, dict]      # split -> shard meta
    counts: Counter             # documents, sentences, examples, tokens, ...
    skipped: Counter            # reason -> count


# ---------------------------------------------------------------- tokenize + build (worker side)

class _Worker:
    """Per-process state: built once per worker (spawned processes cannot share the tokenizer)."""

    def __init__(self, tokenizer_json: str, config: PrepareConfig, settings_sha256: str, output: str):
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.encode = BatchEncoder(self.tokenizer)
        self.ids = PretrainingIds(self.tokenizer)
        self.dtype = token_dtype(self.ids.vocab_size)
        self.typecode = "H" if self.dtype.itemsize == 2 else "I"
        self.config = config
        self.settings_sha256 = settings_sha256
        self.output = Path(output)

    def segments(self, texts: list[str], counts: Counter) -> Iterator[list[array.array]]:
        """Each document as a list of sentences of token ids. One tokenizer call per batch of
        documents; the token stream is cut where the splitter's sentences start (one `char_to_token`
        call per sentence instead of a Python loop over every token's offsets)."""
        max_len = self.config.example.max_segment_tokens
        encodings = self.encode(texts)
        for text, encoding in zip(texts, encodings):
            ids = encoding.ids
            cuts = [0]
            for start, end in sentence_spans(text)[1:]:
                token = None
                while token is None and start < end:  # a character the normaliser dropped has no token
                    token = encoding.char_to_token(start)
                    start += 1
                if token is not None and token > cuts[-1]:
                    cuts.append(token)
            cuts.append(len(ids))
            # Compact arrays: a partition's sentences stay in memory for the dupe-factor passes, and
            # Python int lists would cost ~36 bytes per token instead of 2-4.
            pieces: list[array.array] = []
            for begin, end in zip(cuts, cuts[1:]):
                if end - begin > max_len:
                    counts["sentences cut into pieces (longer than half an example)"] += 1
                    pieces.extend(array.array(self.typecode, ids[i:min(i + max_len, end)])
                                  for i in range(begin, end, max_len))
                elif end > begin:
                    pieces.append(array.array(self.typecode, ids[begin:end]))
            counts["sentences"] += len(cuts) - 1
            yield pieces

    def process(self, partition: int, documents: list[tuple[bool, str]]) -> PartitionResult:
        rng = random.Random(f"partition/{self.config.seed}/{partition}")
        counts, skipped = Counter(), Counter()
        by_split: dict[str, list[list[array.array]]] = {"train": [], "valid": []}
        for batch in _encode_batches(documents):
            texts = [text for _, text in batch]
            for (is_valid, _), segments in zip(batch, self.segments(texts, counts)):
                by_split["valid" if is_valid else "train"].append(segments)
        counts["documents"] += len(documents)
        builders = {split: ShardBuilder(self.dtype) for split in SPLITS}
        static = self.config.masking == "static"
        for split in SPLITS:
            # As BERT: the split is passed `dupe_factor` times, each with new random choices.
            for copy in range(self.config.dupe_factor if static else 1):
                copy_skips = skipped if copy == 0 else Counter()  # count each skipped record once
                for segments in by_split[split]:
                    for example in create_examples(segments, self.config.example, self.ids, rng, copy_skips):
                        positions, inputs = (mask_tokens(example.tokens, self.config.example, self.ids, rng)
                                             if static else ((), ()))
                        builders[split].add(example.tokens, example.a_length, example.sop_label, positions, inputs)
            counts[f"{split} examples"] += len(builders[split])
            counts["example tokens"] += len(builders[split].tokens)
        # The train shard is written last and carries the partition's counts: once its meta exists,
        # the whole partition is done and a re-run can report it without recomputing.
        stats = {"counts": dict(counts), "skipped": dict(skipped)}
        metas = {split: builders[split].write(self.output / split / f"part-{partition:05d}",
                                              self.settings_sha256, stats if split == "train" else {})
                 for split in ("valid", "train")}
        return PartitionResult(partition, metas, counts, skipped)


def _encode_batches(documents: list[tuple[bool, str]]) -> Iterator[list[tuple[bool, str]]]:
    batch: list[tuple[bool, str]] = []
    chars = 0
    for item in documents:
        batch.append(item)
        chars += len(item[1])
        if chars >= _ENCODE_BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


# The multiprocessing initializer pattern: each pool process builds its `_Worker` once, and the
# tasks (partition number + documents) find it here instead of re-sending the tokenizer each time.
_WORKER: _Worker | None = None


def _init_worker(*args, in_pool: bool = True) -> None:
    global _WORKER
    if in_pool:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _WORKER = _Worker(*args)


def _run_partition(partition: int, documents: list[tuple[bool, str]]) -> PartitionResult:
    assert _WORKER is not None
    return _WORKER.process(partition, documents)


# ---------------------------------------------------------------- orchestration (main process)

def _partitions(stream: DocumentStream, config: PrepareConfig) -> Iterator[list[tuple[bool, str]]]:
    """Cut the stream into partitions; mark every `valid_stride`-th document of a source as valid."""
    stride = config.valid_stride
    partition: list[tuple[bool, str]] = []
    chars = 0
    for source_position, text in stream.numbered():
        partition.append((bool(stride) and source_position % stride == stride - 1, text))
        chars += len(text)
        if chars >= config.partition_chars:
            yield partition
            partition, chars = [], 0
    if partition:
        yield partition


def _settings(sources: list[WeightedSource], config: PrepareConfig, tokenizer_spec: str,
              vocab_size: int, tokenizer_sha256: str | None) -> dict:
    return versioned(DATA_SETTINGS, {
        "sources": [{"source": repr(s.source), "weight": s.weight} for s in sources],
        "tokenizer": tokenizer_spec if tokenizer_sha256 is None else tokenizer_sha256,
        "train_vocab_size": vocab_size if tokenizer_spec == "train" else None,
        **{k: v for k, v in asdict(config).items() if k != "example"},
        **{f"example.{k}": v for k, v in asdict(config.example).items()},
    })


def _check_previous_settings(output: Path, settings: dict, overwrite: bool) -> None:
    path = output / SETTINGS_FILE
    if not path.is_file():
        return
    previous = json.loads(path.read_text())
    if previous == settings:
        return
    changed = sorted(k for k in set(previous) | set(settings) if previous.get(k) != settings.get(k))
    if not overwrite:
        raise DataError(f"{output} was prepared with other settings (changed: {', '.join(changed)}); its "
                        "shards do not match this run. Pass --overwrite to rebuild them, or use a new --output")
    for split in SPLITS:
        for file in (output / split).glob("part-*"):
            file.unlink()
    for name in TOKENIZER_FILES:
        (output / name).unlink(missing_ok=True)


def check_output_folder(output: Path) -> None:
    """--output must be new, empty, or a data folder of prepare-data (then the settings decide)."""
    if output.exists() and not output.is_dir():
        raise DataError(f"--output {output} is a file; pass a folder (new or empty) for the prepared data")
    check_writable(output, "--output", subfolders=SPLITS, error=DataError)
    if not output.is_dir():
        return
    # Our own temporary files (".name.xxxx.tmp") are left by an interrupted run and are harmless; the lock
    # file is another prepare-data's, which the lock then names.
    entries = sorted(p.name for p in output.iterdir()
                     if not (p.name.startswith(".") and p.name.endswith(".tmp")) and p.name != LOCK_FILE)
    if not entries:
        return
    foreign = [name for name in entries if name not in DATA_FOLDER_ENTRIES]
    if SETTINGS_FILE in entries and not foreign:
        return
    what = (f"it holds {', '.join(foreign[:6])}{' ...' if len(foreign) > 6 else ''}, which prepare-data did not write"
            if SETTINGS_FILE in entries else
            f"it is not a data folder of prepare-data (no {SETTINGS_FILE}; it holds "
            f"{', '.join(entries[:6])}{' ...' if len(entries) > 6 else ''})")
    raise DataError(f"--output {output} is not empty and {what}; writing shards and tokenizer files there could "
                    "replace another run's files (e.g. a pretraining run's tokenizer). Pass a new or empty --output")


def prepare(sources: list[WeightedSource], output: Path, config: PrepareConfig, tokenizer: str = "train",
            vocab_size: int = 30000, workers: int = 1, overwrite: bool = False,
            progress: bool = True) -> Manifest:
    """Build the data folder; return the manifest. `tokenizer`: "train" or a tokenizer/vocab path."""
    if not sources:
        raise DataError("no sources given; pass --source PATH (or hf:NAME) or --default-corpus")
    if workers < 1:
        raise DataError(f"--workers {workers} must be at least 1")
    check_output_folder(output)
    given_sha = None if tokenizer == "train" else file_sha256(_tokenizer_file(Path(tokenizer)))
    for weighted in sources:
        if isinstance(weighted.source, HFSource):
            weighted.source.check_reachable()
    payload = expected_bytes(sources, config)
    fix = ("Free space there, or pass an --output on a disk with more space; a re-run of the same command keeps the "
           "shards already finished.")
    check_free_space(output, payload, f"the prepared data in {output}", fix)
    with folder_lock(output, "widenet-ds prepare-data") as lock:
        if lock.takeover_message:
            print(f"prepare-data: {lock.takeover_message}", file=sys.stderr)
        before = set(os.listdir(output))
        try:
            with disk_full_errors(output, payload, f"the prepared data in {output}", fix):
                return _prepare(sources, output, config, tokenizer, vocab_size, workers, overwrite, progress, given_sha)
        except BaseException:
            _remove_if_nothing_built(output, before)
            raise


def expected_bytes(sources: list[WeightedSource], config: PrepareConfig) -> int:
    """About what the shards take: as many bytes as the local sources' text (2-4 bytes per token of ~4
    characters, plus the index), once per static-masking copy; HF and the default corpus not counted."""
    copies = config.dupe_factor if config.masking == "static" else 1
    total = 0
    for weighted in sources:
        source = weighted.source
        paths = source.files() if isinstance(source, TextSource) else [getattr(source, "path", None)]
        total += int(weighted.weight * sum(p.stat().st_size for p in paths if p is not None and p.is_file()))
    return total * copies


def _remove_if_nothing_built(output: Path, before: set[str]) -> None:
    """A run that failed before finishing any shard leaves the folder as it found it: no settings file that
    would refuse the corrected command ("prepared with other settings"), no tokenizer of its own."""
    if any(True for split in SPLITS for _ in (output / split).glob("part-*.json")):
        return  # finished shards: a re-run of the same command continues from them
    for name in (SETTINGS_FILE, MANIFEST_FILE, *TOKENIZER_FILES, *SPLITS):
        path = output / name
        if name in before or not path.exists():
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _prepare(sources: list[WeightedSource], output: Path, config: PrepareConfig, tokenizer: str, vocab_size: int,
             workers: int, overwrite: bool, progress: bool, given_sha: str | None) -> Manifest:
    settings = _settings(sources, config, tokenizer, vocab_size, given_sha)
    _check_previous_settings(output, settings, overwrite)
    (output / MANIFEST_FILE).unlink(missing_ok=True)  # present only when the data is complete
    _write_json(output / SETTINGS_FILE, settings)

    tok = _resolve_tokenizer(sources, output, config, tokenizer, vocab_size, progress)
    tokenizer_sha = save_tokenizer(tok, output) if given_sha or not (output / TOKENIZER_FILE).is_file() \
        else file_sha256(output / TOKENIZER_FILE)
    settings_sha = hashlib.sha256(json.dumps([settings, tokenizer_sha], sort_keys=True).encode()).hexdigest()

    started = time.perf_counter()
    stream = DocumentStream(sources, config.seed)
    results: dict[int, PartitionResult] = {}
    worker_args = (tok.to_str(), config, settings_sha, str(output))
    bar = _progress_bar(progress)
    pending: collections.deque = collections.deque()
    pool = None
    if workers == 1:
        _init_worker(*worker_args, in_pool=False)
    else:
        pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, worker_args)
    try:
        for partition, documents in enumerate(_partitions(stream, config)):
            previous = _finished_partition(output, partition, settings_sha)
            if previous is not None:
                results[partition] = previous
                bar.update(len(documents))
                continue
            if pool is None:
                results[partition] = _run_partition(partition, documents)
            else:
                pending.append(pool.apply_async(_run_partition, (partition, documents)))
                while len(pending) > workers:
                    result = pending.popleft().get()
                    results[result.partition] = result
            bar.update(len(documents))
            bar.set_postfix(partitions=len(results))
        while pending:
            result = pending.popleft().get()
            results[result.partition] = result
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    manifest = _manifest(results, settings, tokenizer_sha, settings_sha, tok, config, stream.skipped,
                         time.perf_counter() - started)
    _write_json(output / MANIFEST_FILE, manifest)
    return Manifest.from_json(manifest, output / MANIFEST_FILE)


def _tokenizer_file(path: Path) -> Path:
    if path.is_dir():
        found = TokenizerFiles.in_folder(path)
        if found:
            return found.paths[0]
        raise DataError(f"--tokenizer {str(path)!r} is a folder holding neither tokenizer.json nor vocab.txt; pass "
                        "'train', a tokenizer.json, a vocab.txt or a folder holding one")
    if not path.is_file():
        raise DataError(f"--tokenizer {str(path)!r} does not exist; pass 'train', a tokenizer.json, a "
                        "vocab.txt or a folder holding one")
    return path


def _resolve_tokenizer(sources, output, config, tokenizer, vocab_size, progress) -> Tokenizer:
    if tokenizer != "train":
        return load_tokenizer(tokenizer)
    if (output / TOKENIZER_FILE).is_file():  # trained by an earlier run with the same settings
        return load_tokenizer(output / TOKENIZER_FILE)
    skipped = SkipCounter()
    trained = train_tokenizer(DocumentStream(sources, config.seed, skipped), vocab_size, show_progress=progress)
    if skipped and progress:
        print(f"tokenizer training skipped: {dict(skipped)}", file=sys.stderr)
    return trained


def _finished_partition(output: Path, partition: int, settings_sha: str) -> PartitionResult | None:
    """The results of a partition an earlier run finished, else None (to be built). A finished shard
    whose files no longer match their checksums is rebuilt, and said so."""
    metas = {}
    for split in SPLITS:
        stem = output / split / f"part-{partition:05d}"
        meta = read_complete_meta(stem, settings_sha)
        if meta is None:
            written = read_shard_meta(stem)
            if written is not None and written.get("settings_sha256") == settings_sha:
                print(f"prepare-data: rebuilding damaged shard {split}/part-{partition:05d} "
                      f"({'; '.join(shard_problems(stem, written))})", file=sys.stderr)
            return None
        metas[split] = meta
    stats = metas["train"]["stats"]
    return PartitionResult(partition, metas, Counter(stats["counts"]), Counter(stats["skipped"]))


def _manifest(results: dict[int, PartitionResult], settings: dict, tokenizer_sha: str, settings_sha: str,
              tok: Tokenizer, config: PrepareConfig, source_skips: Counter, seconds: float) -> dict:
    if not results:
        raise DataError("the sources hold no documents (empty files or only blank lines); nothing to prepare")
    counts, skipped = Counter(), Counter(source_skips)
    for result in results.values():
        counts.update(result.counts)
        skipped.update(result.skipped)
    splits = {}
    for split in SPLITS:
        shards = [{"name": f"{split}/part-{p:05d}", **{k: results[p].metas[split][k]
                                                       for k in ("examples", "tokens", "masks", *CHECKSUM_KEYS)
                                                       if k in results[p].metas[split]}}
                  for p in sorted(results)]
        shards = [s for s in shards if s["examples"]]
        if shards:  # a corpus too small for a held-out split has no "valid" entry
            splits[split] = {"examples": sum(s["examples"] for s in shards),
                             "tokens": sum(s["tokens"] for s in shards), "shards": shards}
    if "train" not in splits:
        raise DataError(f"no training examples could be built ({counts['documents']} documents, skipped: "
                        f"{dict(skipped)}); documents need at least two sentences for sentence-order pairs")
    vocab_size = tok.get_vocab_size()
    return versioned(MANIFEST, {
        "seq_length": config.example.seq_length,
        "vocab_size": vocab_size,
        "dtype": token_dtype(vocab_size).name,
        "masking": config.masking,
        "max_predictions_per_seq": config.example.max_predictions,
        "masked_lm_prob": config.example.masked_lm_prob,
        "max_ngram": config.example.max_ngram,
        "seed": config.seed,
        "tokenizer_sha256": tokenizer_sha,
        "settings_sha256": settings_sha,
        "settings": settings,
        "splits": splits,
        "summary": {"counts": dict(sorted(counts.items())), "skipped": dict(sorted(skipped.items())),
                    "seconds": round(seconds, 2)},
    })


def _write_json(path: Path, data: dict) -> None:
    atomic_write_json(path, data, indent=1, sort_keys=True)


def _progress_bar(enabled: bool):
    from tqdm import tqdm

    return tqdm(unit=" docs", desc="prepare-data", disable=not enabled, file=sys.stderr)


def format_summary(manifest: Manifest) -> str:
    summary = manifest.summary
    examples = " / ".join(f"{info.examples} {split}" for split, info in manifest.splits.items())
    lines = [f"prepared {examples} examples of {manifest.seq_length} tokens in {summary['seconds']} s"]
    lines += [f"  {name}: {value}" for name, value in summary["counts"].items()]
    lines += [f"  skipped {value}: {reason}" for reason, value in summary["skipped"].items()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """`widenet-ds prepare-data`'s options, each with its help and default."""
    parser = argparse.ArgumentParser(prog="widenet-ds prepare-data", description=cli.__doc__)
    parser.add_argument("--source", action="append", default=[], metavar="PATH[:WEIGHT]",
                        help="text file/folder, .jsonl, .parquet, or hf:NAME[@CONFIG] (hf:wikipedia, "
                             "hf:bookcorpus); repeatable; WEIGHT repeats (>1) or subsamples (<1) documents")
    parser.add_argument("--default-corpus", action="store_true", help="add the embedded English corpus")
    parser.add_argument("--text-field", default="text", help="JSON/Parquet/HF field holding the text (default: %(default)s)")
    parser.add_argument("--document-per-file", action="store_true",
                        help="a text file is one document (default: one per blank-line block)")
    parser.add_argument("--tokenizer", default="train", help="'train' (default), or a tokenizer.json / vocab.txt / folder")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="when training the tokenizer (--tokenizer train; default 30000)")
    parser.add_argument("--seq-length", type=int, default=128, help="tokens per example ([CLS] A [SEP] B [SEP]; default: %(default)s)")
    parser.add_argument("--short-seq-prob", type=float, default=0.1,
                        help="share of examples cut to a random shorter length (ALBERT's; default: %(default)s)")
    parser.add_argument("--masked-lm-prob", type=float, default=0.15, help="share of the tokens masked (default: %(default)s)")
    parser.add_argument("--max-predictions-per-seq", type=int, default=None,
                        help="masked tokens per example at most (default: masked-lm-prob x seq-length, rounded up)")
    parser.add_argument("--max-ngram", type=int, default=3, help="longest n-gram span masked at once (ALBERT's; default: %(default)s)")
    parser.add_argument("--masking", choices=("static", "dynamic"), default="dynamic",
                        help="static: masks drawn once and stored (x dupe-factor); dynamic (default): in the loader")
    parser.add_argument("--dupe-factor", type=int, default=1, help="static masking: copies with new masks (default: %(default)s)")
    parser.add_argument("--valid-fraction", type=float, default=0.01,
                        help="share of the documents held out as the valid split (the runs' evaluation; default: "
                             "%(default)s)")
    parser.add_argument("--partition-mb", type=float, default=16, help="text per shard (millions of chars; default: %(default)s)")
    parser.add_argument("--output", type=Path, required=True, help="the data folder to write (new or empty)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="processes tokenizing and building examples (default: this machine's cores, %(default)s)")
    parser.add_argument("--seed", type=int, default=12345, help="document order, masks and SOP swaps (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="rebuild shards made with other settings")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def cli(argv: list[str]) -> int:
    """`widenet-ds prepare-data`: build sharded ALBERT MLM+SOP examples and their tokenizer."""
    args = build_parser().parse_args(argv)
    if args.vocab_size is not None and args.tokenizer != "train":
        raise DataError(f"--vocab-size {args.vocab_size} only applies to --tokenizer train; the given tokenizer "
                        f"{args.tokenizer} keeps its own vocabulary. Drop --vocab-size, or pass --tokenizer train")

    sources = [parse_source(spec, args.text_field, args.document_per_file) for spec in args.source]
    if args.default_corpus:
        sources.append(WeightedSource(DefaultCorpusSource()))
    example = ExampleConfig(args.seq_length, args.short_seq_prob, args.masked_lm_prob,
                            args.max_predictions_per_seq, args.max_ngram)
    config = PrepareConfig(example, args.masking, args.dupe_factor, args.seed, args.valid_fraction,
                           int(args.partition_mb * (1 << 20)))
    manifest = prepare(sources, args.output, config, args.tokenizer, args.vocab_size or 30000, args.workers,
                       args.overwrite, progress=not args.no_progress)
    print(format_summary(manifest))
    print(f"data written to {args.output}")
    return 0
