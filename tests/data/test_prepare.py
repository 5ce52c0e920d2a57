"""prepare-data: determinism across worker counts, re-runs, interruption, bad input, the CLI summary."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from widenet_ds.data import shards
from widenet_ds.data.examples import ExampleConfig
from widenet_ds.data.loader import PretrainingDataLoader
from widenet_ds.data.manifest import read_manifest
from widenet_ds.data.prepare import PrepareConfig, cli, prepare
from widenet_ds.data.sources import parse_source
from widenet_ds.errors import DataError
from widenet_ds.fs.disk_space import DiskFullError

# Small partitions so a 1 MB input is several shards and two workers really split the work.
SMALL = dict(partition_chars=150_000, valid_fraction=0.02)


def folder_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file except the manifest's timing, keyed by relative path."""
    digests = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "manifest.json":
                manifest = json.loads(data)
                manifest["summary"].pop("seconds")
                data = json.dumps(manifest, sort_keys=True).encode()
            digests[str(path.relative_to(folder))] = hashlib.sha256(data).hexdigest()
    return digests


@pytest.fixture(scope="module")
def wiki(shared_data) -> Path:
    return shared_data / "corpus" / "wikitext-2" / "wiki.valid.tokens"


@pytest.fixture(scope="module")
def vocab(shared_data) -> Path:
    return shared_data / "vocab" / "bert-base-uncased-vocab.txt"


@pytest.mark.parametrize("masking", ["dynamic", "static"])
def test_output_is_byte_identical_for_any_worker_count(tmp_path, wiki, vocab, masking):
    config = PrepareConfig(ExampleConfig(seq_length=64), masking=masking, dupe_factor=2, seed=7, **SMALL)
    one = prepare([parse_source(str(wiki))], tmp_path / "w1", config, str(vocab), workers=1, progress=False)
    prepare([parse_source(str(wiki))], tmp_path / "w2", config, str(vocab), workers=2, progress=False)
    assert len(one.splits["train"].shards) >= 5  # several partitions, really spread over workers
    assert one.splits["valid"].examples > 0
    assert folder_digest(tmp_path / "w1") == folder_digest(tmp_path / "w2")
    # And a different seed gives different examples (the check above could not pass vacuously).
    other = prepare([parse_source(str(wiki))], tmp_path / "s8", PrepareConfig(
        ExampleConfig(seq_length=64), masking=masking, dupe_factor=2, seed=8, **SMALL), str(vocab), progress=False)
    assert other.splits["train"].shards[0]["bin_sha256"] != one.splits["train"].shards[0]["bin_sha256"]


def test_rerun_skips_finished_shards_and_detects_changed_settings(tmp_path, wiki, vocab):
    out = tmp_path / "data"
    config = PrepareConfig(ExampleConfig(seq_length=64), seed=1, **SMALL)
    first = prepare([parse_source(str(wiki))], out, config, str(vocab), progress=False)
    shard = out / first.splits["train"].shards[0]["name"]
    mtime = shard.with_suffix(".bin").stat().st_mtime_ns
    # Remove one shard's completion marker: only that partition is rebuilt.
    victim = out / first.splits["train"].shards[1]["name"]
    victim.with_suffix(".json").unlink()
    second = prepare([parse_source(str(wiki))], out, config, str(vocab), progress=False)
    assert shard.with_suffix(".bin").stat().st_mtime_ns == mtime
    assert victim.with_suffix(".json").is_file()
    assert second.splits == first.splits and second.summary["counts"] == first.summary["counts"]

    changed = PrepareConfig(ExampleConfig(seq_length=96), seed=1, **SMALL)
    with pytest.raises(DataError, match=r"other settings \(changed: example.seq_length\).*--overwrite"):
        prepare([parse_source(str(wiki))], out, changed, str(vocab), progress=False)
    rebuilt = prepare([parse_source(str(wiki))], out, changed, str(vocab), overwrite=True, progress=False)
    assert rebuilt.seq_length == 96
    assert read_manifest(out).settings_sha256 != first.settings_sha256


def test_interrupted_preparation_leaves_no_complete_looking_shard(tmp_path, wiki, vocab):
    out = tmp_path / "data"
    big = tmp_path / "big.txt"
    big.write_bytes(wiki.read_bytes() * 3)
    args = ["--source", str(big), "--tokenizer", str(vocab), "--output", str(out), "--workers", "2",
            "--partition-mb", "0.15", "--seq-length", "64", "--no-progress"]
    code = "import sys; from widenet_ds.data.prepare import cli; sys.exit(cli(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(out.glob("train/part-*.json")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole tree, workers included, mid-run
    proc.wait()
    assert list(out.glob("train/part-*.json")), "preparation finished no shard before the kill"
    assert not (out / "manifest.json").exists()
    with pytest.raises(DataError, match="did not finish"):
        read_manifest(out)
    for meta_path in out.glob("*/part-*.json"):
        meta = json.loads(meta_path.read_text())  # every marker is whole and its data matches it
        assert meta_path.with_suffix(".bin").stat().st_size == meta["bin_bytes"]
        assert np.load(meta_path.with_suffix(".idx.npy")).shape[0] == meta["examples"]
    # Completing the run gives the same data as an uninterrupted one.
    assert cli(args) == 0
    assert cli([*args[:5], str(tmp_path / "fresh"), *args[6:]]) == 0
    assert folder_digest(out) == folder_digest(tmp_path / "fresh")


def test_cli_trains_tokenizer_and_prints_summary(tmp_path, shared_data, capsys):
    book = shared_data / "corpus" / "books" / "pg11.txt"
    out = tmp_path / "data"
    assert cli(["--source", str(book), "--document-per-file", "--vocab-size", "2000", "--output", str(out),
                "--seq-length", "128", "--workers", "1", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    manifest = read_manifest(out)
    for name in ("documents: 1", "sentences:", "train examples:", "example tokens:"):
        assert name in printed
    assert manifest.vocab_size == 2000 and manifest.dtype == "uint16"
    assert (out / "tokenizer.json").is_file() and len((out / "vocab.txt").read_text().splitlines()) == 2000
    assert manifest.splits["train"].examples > 100


# ------------------------------------------------------------------------------------------ bad input

def test_missing_path_names_the_path(tmp_path):
    with pytest.raises(DataError, match="does-not-exist.txt.*does not exist"):
        parse_source(str(tmp_path / "does-not-exist.txt"))


def test_empty_corpus_is_an_error_that_leaves_nothing_behind(tmp_path, vocab):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(DataError, match="hold no documents"):
        prepare([parse_source(str(empty))], tmp_path / "out", PrepareConfig(), str(vocab), progress=False)
    assert not (tmp_path / "out").exists()  # no prepare_settings.json that would refuse the corrected command
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("the user's")  # a folder the run did not make is only cleaned
    empty.write_text("one.\n")
    with pytest.raises(DataError):
        prepare([parse_source(str(empty))], tmp_path / "out", PrepareConfig(), "train", progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt"]
    (tmp_path / "out" / "notes.txt").unlink()
    empty.write_bytes(GOOD_DOC * 40)  # the corrected source, same --output
    assert prepare([parse_source(str(empty))], tmp_path / "out", PrepareConfig(ExampleConfig(seq_length=64)),
                   str(vocab), progress=False).splits["train"].examples > 0


def test_a_disk_filling_up_is_one_error_keeping_the_finished_shards_to_continue_from(tmp_path, wiki, vocab,
                                                                                     monkeypatch):
    """Simulated: the second shard's write meets a full disk (ENOSPC), as when another program fills it."""
    real_write = shards.atomic_write_bytes

    def write_until_full(path, data):
        if "part-00001" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, data)

    monkeypatch.setattr(shards, "atomic_write_bytes", write_until_full)
    args = dict(sources=[parse_source(str(wiki))], output=tmp_path / "data", tokenizer=str(vocab), progress=False)
    with pytest.raises(DiskFullError, match=rf"the disk holding {tmp_path / 'data'} filled up while writing the "
                                            rf"prepared data .*about [\d.]+ MiB needed.*a re-run of the same command "
                                            rf"keeps the shards already finished"):
        prepare(config=PrepareConfig(**SMALL), **args)
    assert sorted(p.name for p in (tmp_path / "data" / "train").iterdir()) == [
        "part-00000.bin", "part-00000.idx.npy", "part-00000.json"]  # finished; nothing of part 1
    monkeypatch.setattr(shards, "atomic_write_bytes", real_write)  # space freed: the same command continues
    assert len(prepare(config=PrepareConfig(**SMALL), **args).splits["train"].shards) > 1


def _prepare_text(tmp_path: Path, vocab: Path, text: bytes, **config) -> dict:
    source = tmp_path / "input.txt"
    source.write_bytes(text)
    return prepare([parse_source(str(source))], tmp_path / "out",
                   PrepareConfig(ExampleConfig(seq_length=64), valid_fraction=0.0, **config), str(vocab),
                   progress=False)


GOOD_DOC = b"The cat sat on the mat. It was warm there. The dog did not mind at all. Then it rained.\n\n"


def test_non_utf8_document_is_skipped_and_counted(tmp_path, vocab):
    manifest = _prepare_text(tmp_path, vocab, GOOD_DOC + b"Bad \xff\xfe bytes here. Second one.\n\n" + GOOD_DOC)
    assert manifest.summary["skipped"] == {"document with non-UTF-8 bytes": 1}
    assert manifest.summary["counts"]["documents"] == 2
    assert list(manifest.splits) == ["train"]  # --valid-fraction 0: no held-out split
    with pytest.raises(DataError, match="split 'valid' is not in .*--valid-fraction"):
        PretrainingDataLoader(tmp_path / "out", 1, split="valid")


def test_one_sentence_document_is_skipped_and_counted(tmp_path, vocab):
    manifest = _prepare_text(tmp_path, vocab, GOOD_DOC + b"Only one sentence here.\n\n")
    assert manifest.summary["skipped"]["document with fewer than 2 sentences (no SOP pair)"] == 1
    assert manifest.splits["train"].examples >= 1


def test_ten_megabyte_single_line_is_cut_into_examples(tmp_path, vocab):
    words = b"alpha beta gamma delta epsilon zeta eta theta iota kappa "
    line = words * (10 * 2**20 // len(words) + 1)  # 10 MB, no sentence punctuation, no newline
    manifest = _prepare_text(tmp_path, vocab, GOOD_DOC + line, partition_chars=1 << 20)
    counts = manifest.summary["counts"]
    assert counts["sentences cut into pieces (longer than half an example)"] == 1
    # Pieces of (64 - 3) // 2 = 30 tokens are packed as BERT does (up to 61 tokens, truncating the
    # overflow), so most of the line's 11 tokens per repetition end up in examples.
    line_tokens = 11 * (len(line) // len(words))
    examples = manifest.splits["train"].examples
    content_tokens = manifest.splits["train"].tokens - 3 * examples
    assert 0.6 * line_tokens < content_tokens <= line_tokens + 100


def test_every_option_says_what_it_does_and_its_default():
    """`prepare-data --help`: no option without help text; every option with a value names its default."""
    from widenet_ds.data.prepare import build_parser

    options = [a for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert not [a.option_strings[0] for a in options if not a.help]
    valued = [a for a in options if a.nargs != 0 and not a.required and a.dest != "source"]
    assert not [a.option_strings[0] for a in valued if "default" not in a.help], [a.help for a in valued]
