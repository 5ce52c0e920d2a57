"""Token ids for finetuning against HF's fast-tokenizer front end, the model-fit checks and the recipes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.tasks_fixtures import bert_tokenizer, hf_reference_tokenizer  # noqa: F401  (fixtures)
from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.tasks.finetune.features import (
    check_max_length,
    check_tokenizer_matches,
    encode_pairs,
    glue_features,
    truncate_longest_first,
)
from widenet_ds.tasks.glue.datasets import load_glue_split


def test_pairs_match_hf_fast_tokenizer_on_real_rte(shared_data, bert_tokenizer, hf_reference_tokenizer):
    """RTE premises are long: at 64 tokens a third of the pairs are truncated longest-first."""
    examples = load_glue_split("RTE", "dev", shared_data / "glue").examples
    a, b = [e.text_a for e in examples], [e.text_b for e in examples]
    ours = encode_pairs(bert_tokenizer, a, b, max_seq_length=64)
    ref = hf_reference_tokenizer(a, b, truncation="longest_first", max_length=64, return_token_type_ids=True)
    assert ours.input_ids == ref["input_ids"]
    assert ours.token_type_ids == ref["token_type_ids"]
    untruncated = hf_reference_tokenizer(a, b)["input_ids"]
    assert ours.n_truncated == sum(len(x) > 64 for x in untruncated) > 50


def test_single_sentences_match_hf(shared_data, bert_tokenizer, hf_reference_tokenizer):
    examples = load_glue_split("CoLA", "dev", shared_data / "glue").examples
    texts = [e.text_a for e in examples]
    ours = encode_pairs(bert_tokenizer, texts, None, max_seq_length=12)
    assert ours.input_ids == hf_reference_tokenizer(texts, truncation=True, max_length=12)["input_ids"]


@pytest.mark.parametrize("seed", range(3))
def test_truncation_closed_form_matches_hf_on_synthetic_lengths(seed, hf_reference_tokenizer):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        la, lb, budget = (int(x) for x in rng.integers(1, 30, 3))
        ref = hf_reference_tokenizer(" ".join("a" * la), " ".join("b" * lb), truncation="longest_first",
                                     max_length=budget + 3)["input_ids"]
        aid, bid = hf_reference_tokenizer.convert_tokens_to_ids(["a", "b"])
        assert truncate_longest_first(la, lb, budget) == (ref.count(aid), ref.count(bid)), (la, lb, budget)


def test_glue_features_collate_pads_and_masks(shared_data, bert_tokenizer):
    feats = glue_features(load_glue_split("STS-B", "dev", shared_data / "glue"), bert_tokenizer, 128)
    batch = feats.collate([feats[i] for i in range(4)])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["token_type_ids"].shape
    assert batch["labels"].dtype.is_floating_point and batch["labels"][1].item() == pytest.approx(4.75)
    lengths = batch["attention_mask"].sum(1).tolist()
    assert lengths == [len(feats.input_ids[i]) for i in range(4)]
    assert (batch["input_ids"][batch["attention_mask"] == 0] == feats.pad_id).all()


def test_tokenizer_must_match_checkpoint_vocab(bert_tokenizer):
    check_tokenizer_matches(bert_tokenizer, 30522)
    with pytest.raises(CheckpointError, match="tokenizer has 30522 tokens but the checkpoint's embeddings have 30000"):
        check_tokenizer_matches(bert_tokenizer, 30000)


def test_max_length_must_fit_positions():
    check_max_length(512, 512)
    with pytest.raises(ConfigError, match="max sequence length 1024 exceeds the model's 512 .* pass a max length <= 512"):
        check_max_length(1024, 512)
