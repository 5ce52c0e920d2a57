"""Token ids for finetuning against HF's fast-tokenizer front end, the model-fit checks and the recipes."""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.tasks_fixtures import bert_tokenizer, hf_reference_tokenizer  # noqa: F401  (fixtures)

from widenet_ds.errors import CheckpointError, ConfigError
from widenet_ds.benchmarks.features import (
    check_max_length,
    check_tokenizer_matches,
    encode_pairs,
    glue_features,
    truncate_longest_first,
)
from widenet_ds.benchmarks.glue import load_glue_split
from widenet_ds.benchmarks.recipes import RECIPES, recipe_for


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


def test_recipes_table7_and_their_differences_from_a_deepspeed_json():
    assert RECIPES["MNLI"].source == "widenet-table7"
    assert (RECIPES["SST-2"].steps, RECIPES["SST-2"].batch_size, RECIPES["SST-2"].learning_rate) == (5234, 128, 4e-5)
    v2 = recipe_for("squad_v2")
    assert (v2.capacity_factor, v2.balance_weight, v2.dropout, v2.max_seq_length) == (1.2, 0.01, 0.0, 512)
    v1 = recipe_for("SQuAD1.1")
    assert (v1.capacity_factor, v1.balance_weight, v1.dropout, v1.max_seq_length) == (2.0, 0.0, 0.1, 384)
    rte = recipe_for("rte")  # 800 steps, warmup 200, batch 32, lr 3e-5
    assert rte.differences(batch_size=32, learning_rate=3e-5, warmup_steps=200, steps=800) == []
    assert rte.differences(batch_size=128, learning_rate=3e-5, warmup_steps=None, steps=800) == [
        "batch size 32 in the recipe, 128 in the DeepSpeed JSON", "warmup steps 200 in the recipe, not set in the "
        "DeepSpeed JSON"]
    with pytest.raises(ConfigError, match="AX has no finetuning recipe"):
        recipe_for("AX")
