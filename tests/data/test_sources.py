"""Document sources: text files/folders, JSON lines, Parquet, the HF `datasets` path, weighted mixing."""

from __future__ import annotations

import json
import socket
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from widenet_ds.data.sources import (
    DocumentStream,
    HFSource,
    JsonlSource,
    ParquetSource,
    SkipCounter,
    TextSource,
    WeightedSource,
    parse_source,
)
from widenet_ds.errors import DataError

DOCS = ["First document. It has two sentences.", "Second document here. Also two.", "Third one. Yes."]


def test_text_blocks_folders_and_document_per_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("\n\n".join(DOCS[:2]) + "\n")
    (tmp_path / "sub" / "b.txt").write_text("\n \n" + DOCS[2] + "\n\n\n")
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")
    skipped = SkipCounter()
    assert [d.strip() for d in TextSource(tmp_path).documents(skipped)] == DOCS
    assert [d.strip() for d in TextSource(tmp_path, document_per_file=True).documents(skipped)] == [
        "\n\n".join(DOCS[:2]), DOCS[2]]
    assert not skipped
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no text files"):
        TextSource(tmp_path / "empty").files()


def test_jsonl_counts_malformed_and_missing_fields(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": DOCS[0]}), "{broken", json.dumps({"body": "x"}), json.dumps({"text": "  "}),
             json.dumps({"text": DOCS[1]})]
    path.write_text("\n".join(lines) + "\n")
    skipped = SkipCounter()
    assert list(JsonlSource(path).documents(skipped)) == DOCS[:2]
    assert skipped == {"malformed JSON line": 1, "record without a string 'text' field": 1, "empty document": 1}


def test_parquet_and_the_hf_datasets_code_path_read_the_same_documents(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"content": DOCS + [None]}), path)
    skipped = SkipCounter()
    assert list(ParquetSource(path, "content").documents(skipped)) == DOCS
    # HFSource runs `datasets.load_dataset(..., streaming=True)` exactly as for hub datasets.
    hf = HFSource("parquet", split="train", text_field="content", data_files=str(path))
    assert list(hf.documents(skipped)) == DOCS
    grouped = HFSource("parquet", split="train", text_field="content", data_files=str(path), rows_per_document=2)
    assert list(grouped.documents(SkipCounter())) == ["\n".join(DOCS[:2]), DOCS[2]]
    with pytest.raises(DataError, match="no column 'text'"):
        list(ParquetSource(path).documents(skipped))


def test_parse_source_specs(tmp_path):
    (tmp_path / "a.txt").write_text(DOCS[0])
    assert parse_source(f"{tmp_path}/a.txt:2.5") == WeightedSource(TextSource(tmp_path / "a.txt"), 2.5)
    wiki = parse_source("hf:wikipedia")
    assert wiki.source == HFSource("wikimedia/wikipedia", "20231101.en") and wiki.weight == 1.0
    books = parse_source("hf:bookcorpus:0.5").source
    assert books.rows_per_document > 1 and parse_source("hf:bookcorpus:0.5").weight == 0.5
    assert parse_source("hf:someone/corpus@en").source == HFSource("someone/corpus", "en")
    with pytest.raises(DataError, match="positive"):
        parse_source(f"{tmp_path}/a.txt:-1")


def test_weights_repeat_or_subsample_deterministically(tmp_path):
    path = tmp_path / "many.txt"
    path.write_text("\n\n".join(f"Document number {i}. Second sentence." for i in range(400)))
    double = list(DocumentStream([WeightedSource(TextSource(path), 2.0)], seed=0))
    assert len(double) == 800 and double[0] == double[1]
    half = [list(DocumentStream([WeightedSource(TextSource(path), 0.5)], seed=s)) for s in (0, 0, 1)]
    assert half[0] == half[1] and half[0] != half[2]
    assert 160 < len(half[0]) < 240
    mixed = list(DocumentStream([WeightedSource(TextSource(path), 1.0), WeightedSource(TextSource(path), 0.25)], 3))
    assert 480 < len(mixed) < 520


def test_a_hub_dataset_without_the_hub_is_refused_at_once(monkeypatch):
    with socket.socket() as sock:  # a port nobody serves: the hub unreachable, as offline
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(DataError, match=r"hf:wikimedia/wikipedia needs the HF hub \(127\.0\.0\.1\).*HF_DATASETS_OFFLINE"):
        parse_source("hf:wikipedia").source.check_reachable()
    assert time.monotonic() - start < 5
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the cache is used: nothing to reach
    parse_source("hf:wikipedia").source.check_reachable()
    HFSource("json", data_files="x.jsonl").check_reachable()  # local files through a builder
