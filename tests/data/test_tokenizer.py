"""WordPiece tokenizer: parity with transformers' reference BertTokenizer, training, save/load, CLI."""

from __future__ import annotations

import pytest

from widenet_ds.data.sentences import sentence_spans
from widenet_ds.data.tokenizer import SPECIAL_TOKENS, cli, load_tokenizer, save_tokenizer, train_tokenizer
from widenet_ds.errors import DataError
from widenet_ds.fs.checksums import file_sha256


@pytest.fixture(scope="module")
def sentences(shared_data) -> list[str]:
    books = shared_data / "corpus" / "books"
    text = (books / "pg84.txt").read_text(encoding="utf-8")[20000:60000]
    text += (shared_data / "corpus" / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")[:40000]
    # Accents, curly quotes, CJK and control characters exercise every normalisation step.
    return [text[start:end] for start, end in sentence_spans(text)] + ["Café naïve RÉSUMÉ — “quoted” 東京 in 2024\u0007 ok."]


def test_loaded_vocab_matches_the_reference_python_bert_tokenizer(shared_data, sentences):
    from transformers import BertTokenizer  # the pure-Python implementation of Google's tokenizer

    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    reference = BertTokenizer(str(vocab), do_lower_case=True)
    ours = load_tokenizer(vocab)
    assert ours.get_vocab_size() == 30522
    for sentence in sentences:
        assert ours.encode(sentence, add_special_tokens=False).ids == reference.encode(
            sentence, add_special_tokens=False), sentence


def test_trained_tokenizer_is_uncased_wordpiece_and_round_trips_through_both_files(tmp_path, sentences):
    tokenizer = train_tokenizer(sentences, vocab_size=1500, show_progress=False)
    assert tokenizer.get_vocab_size() == 1500
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert any(token.startswith("##") for token in tokenizer.get_vocab())
    assert tokenizer.encode("The MONSTER Spoke").ids == tokenizer.encode("the monster spoke").ids
    sha = save_tokenizer(tokenizer, tmp_path)
    assert sha == file_sha256(tmp_path / "tokenizer.json")
    from_json, from_vocab = load_tokenizer(tmp_path / "tokenizer.json"), load_tokenizer(tmp_path / "vocab.txt")
    for sentence in sentences[:200]:
        want = tokenizer.encode(sentence, add_special_tokens=False).ids
        assert from_json.encode(sentence, add_special_tokens=False).ids == want
        assert from_vocab.encode(sentence, add_special_tokens=False).ids == want
    assert load_tokenizer(tmp_path).get_vocab() == tokenizer.get_vocab()


def test_bad_tokenizer_inputs_are_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "vocab.txt").write_text("a\nb\n##c\n")
    with pytest.raises(DataError, match=r"lacks the special tokens \['\[PAD\]'"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(DataError, match="not a valid tokenizers JSON"):
        load_tokenizer(tmp_path / "broken.json")
    with pytest.raises(DataError, match="empty"):
        train_tokenizer([], vocab_size=500, show_progress=False)
    with pytest.raises(DataError, match="too small"):
        train_tokenizer(["text"], vocab_size=10, show_progress=False)


def test_cli_trains_and_saves(tmp_path, shared_data, capsys):
    book = shared_data / "corpus" / "books" / "pg11.txt"
    assert cli(["--source", f"{book}:2", "--vocab-size", "800", "--output", str(tmp_path / "tok")]) == 0
    assert "vocabulary of 800 tokens" in capsys.readouterr().out
    assert load_tokenizer(tmp_path / "tok").get_vocab_size() == 800


def test_plain_text_shortcut_gives_the_same_ids_and_offsets(shared_data, sentences):
    from widenet_ds.data.tokenizer import _NOT_PLAIN, BatchEncoder

    tokenizer = load_tokenizer(shared_data / "vocab" / "bert-base-uncased-vocab.txt")
    book = (shared_data / "corpus" / "books" / "pg1342.txt").read_text(encoding="utf-8")
    texts = [book[i:i + 3000] for i in range(0, 300_000, 3000)] + sentences
    assert 0 < sum(_NOT_PLAIN.search(t) is None for t in texts) < len(texts)  # both paths are taken
    want = tokenizer.encode_batch(texts, add_special_tokens=False)
    got = BatchEncoder(tokenizer)(texts)
    assert [e.ids for e in got] == [e.ids for e in want]
    assert [e.offsets for e in got] == [e.offsets for e in want]


def test_training_over_a_stream_says_what_it_does_without_a_false_total(capfd):
    """tokenizers' bar over a stream of unknown length counted "0 / 0": a line before and after instead."""
    from widenet_ds.data.tokenizer import train_tokenizer

    documents = (f"document {i} says word{i % 7} and word{i % 5} again." for i in range(200))
    train_tokenizer(documents, vocab_size=120, show_progress=True)
    err = capfd.readouterr().err
    assert "training the WordPiece vocabulary (120 words) over the documents" in err
    assert "trained the WordPiece vocabulary in" in err and "0 / 0" not in err and "0/0" not in err
