"""The embedded default corpus: real English prose, deterministic, quick, usable end to end."""

from __future__ import annotations

import itertools
import re

from widenet_ds.data.default_corpus import DefaultCorpusSource
from widenet_ds.data.loader import PretrainingDataLoader
from widenet_ds.data.prepare import cli
from widenet_ds.data.sources import SkipCounter


def test_default_corpus_is_megabytes_of_english_prose_in_a_fixed_order(shared_data):
    documents = list(DefaultCorpusSource().documents(SkipCounter()))
    text = "\n\n".join(documents)
    assert len(documents) > 400 and len(text) > 1_500_000
    words = re.findall(r"[a-z]+", text.lower())
    vocab = set((shared_data / "vocab" / "bert-base-uncased-vocab.txt").read_text().split())
    assert sum(w in vocab for w in words) / len(words) > 0.9  # English words, not code or noise
    assert sum(w in ("the", "of", "is", "a", "to") for w in words) / len(words) > 0.1
    # A second pass starts with the same documents (reading all of it again would double the time).
    again = list(itertools.islice(DefaultCorpusSource().documents(SkipCounter()), 150))
    assert again == documents[:150]


def test_prepare_data_with_the_default_corpus_feeds_the_loader(tmp_path, shared_data, capsys):
    out = tmp_path / "data"  # tokenizer training is tested elsewhere; a given vocabulary halves the time
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    assert cli(["--default-corpus", "--tokenizer", str(vocab), "--output", str(out), "--workers", "2",
                "--no-progress"]) == 0
    assert "train examples" in capsys.readouterr().out
    batch = next(iter(PretrainingDataLoader(out, 8, seed=0)))
    assert batch["input_ids"].shape == (8, 128) and int(batch["attention_mask"].sum()) > 8 * 64
