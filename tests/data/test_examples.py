"""ALBERT example building: sentence pairs, SOP labels, short sequences, n-gram whole-word masking."""

from __future__ import annotations

import collections
import random

import pytest

from widenet_ds.data.examples import ExampleConfig, PretrainingIds, create_examples, mask_tokens
from widenet_ds.data.tokenizer import load_tokenizer
from widenet_ds.errors import DataError


@pytest.fixture(scope="module")
def ids(shared_data) -> PretrainingIds:
    return PretrainingIds(load_tokenizer(shared_data / "vocab" / "bert-base-uncased-vocab.txt"))


def numbered_document(num_sentences: int, length: int) -> list[list[int]]:
    """Sentence i is `length` copies of token 2000 + i, so an example reveals where it came from."""
    return [[2000 + i] * length for i in range(num_sentences)]


def test_pairs_fit_and_sop_label_tells_the_order(ids):
    config = ExampleConfig(seq_length=64, short_seq_prob=0.0)
    rng, stats = random.Random(0), collections.Counter()
    labels = collections.Counter()
    for _ in range(200):
        for example in create_examples(numbered_document(12, 9), config, ids, rng, stats):
            tokens = example.tokens
            assert len(tokens) <= 64 and tokens[0] == ids.cls
            assert tokens[example.a_length - 1] == ids.sep and tokens[-1] == ids.sep
            a = tokens[1:example.a_length - 1]
            b = tokens[example.a_length:-1]
            assert a and b
            in_order = max(a) < min(b)
            assert in_order == (example.sop_label == 0), (a, b, example.sop_label)
            labels[example.sop_label] += 1
    assert 0.45 < labels[1] / sum(labels.values()) < 0.55


def test_short_seq_prob_makes_shorter_examples(ids):
    def lengths(prob):
        rng, config = random.Random(1), ExampleConfig(seq_length=128, short_seq_prob=prob)
        return [len(e.tokens) for _ in range(50)
                for e in create_examples(numbered_document(40, 7), config, ids, rng, collections.Counter())]
    full, short = lengths(0.0), lengths(1.0)
    # Without short targets only a document's last chunk can be short.
    assert sorted(full)[len(full) // 3] > 120 and sum(short) / len(short) < 0.75 * sum(full) / len(full)


def test_single_sentence_documents_and_left_over_sentences_are_counted(ids):
    stats = collections.Counter()
    assert create_examples([[2000, 2001]], ExampleConfig(), ids, random.Random(0), stats) == []
    assert stats["document with fewer than 2 sentences (no SOP pair)"] == 1
    # Two 40-token sentences fill the 61-token target; the third is left alone at the end.
    create_examples(numbered_document(3, 40), ExampleConfig(seq_length=64, short_seq_prob=0.0), ids,
                    random.Random(0), stats)
    assert stats["sentence left without a pair at the end of a document"] == 1


def test_masking_takes_whole_words_and_never_specials(ids, shared_data):
    tokenizer = load_tokenizer(shared_data / "vocab" / "bert-base-uncased-vocab.txt")
    text = ("Unquestionably the photosynthesizing microorganisms reproduced uncontrollably in the "
            "extraordinarily overpopulated laboratory, notwithstanding countermeasures.")
    pieces = tokenizer.encode(text, add_special_tokens=False).ids
    tokens = [ids.cls, *pieces, ids.sep, *pieces, ids.sep]
    config = ExampleConfig(seq_length=128)
    counts = collections.Counter()
    for seed in range(300):
        positions, inputs = mask_tokens(tokens, config, ids, random.Random(seed))
        assert positions == sorted(set(positions))
        assert len(positions) == min(config.max_predictions, round(0.15 * len(tokens)))
        chosen = set(positions)
        for p in positions:
            assert not ids.special[tokens[p]]
        for p, token in enumerate(tokens):  # a word is masked whole or not at all
            if ids.continuation[token]:
                assert (p in chosen) == (p - 1 in chosen)
        for p, value in zip(positions, inputs):
            counts["mask" if value == ids.mask else "same" if value == tokens[p] else "random"] += 1
    total = sum(counts.values())
    assert abs(counts["mask"] / total - 0.8) < 0.03 and abs(counts["random"] / total - 0.1) < 0.03


def test_example_config_is_validated():
    with pytest.raises(DataError, match="--seq-length"):
        ExampleConfig(seq_length=4)
    with pytest.raises(DataError, match="--masked-lm-prob"):
        ExampleConfig(masked_lm_prob=0.0)
    assert ExampleConfig(seq_length=128).max_predictions == 20
    assert ExampleConfig(seq_length=512).max_predictions == 77
