"""Fixtures for the tests of the finetuning tasks (widenet_ds/tasks/): a real WordPiece fast tokenizer over the
shared BERT vocab.

Import the fixtures into a test module (`from tests.support.tasks_fixtures import bert_tokenizer`)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bert_tokenizer(shared_data: Path):
    from tokenizers import BertWordPieceTokenizer

    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    if not vocab.is_file():
        pytest.skip(f"{vocab} not found")
    return BertWordPieceTokenizer(str(vocab), lowercase=True)._tokenizer


@pytest.fixture(scope="module")
def hf_reference_tokenizer(bert_tokenizer):
    """transformers' fast-tokenizer front end over the same vocabulary: the reference for windowing,
    pair truncation and offsets."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    # A copy: transformers reconfigures truncation on the object it wraps.
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(bert_tokenizer.to_str()), cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", unk_token="[UNK]")
