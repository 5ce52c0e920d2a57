"""SQuAD reading, windowed features (against HF's fast-tokenizer overflow), decoding and output files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.tasks_fixtures import bert_tokenizer, hf_reference_tokenizer  # noqa: F401  (fixtures)
from widenet_ds.errors import ConfigError, DataError
from widenet_ds.tasks.squad.data import (
    SquadAnswer,
    SquadExample,
    read_squad_json,
    squad_examples_from_hf_rows,
    squad_json_from_examples,
)
from widenet_ds.tasks.squad.features import SquadFeatureConfig, build_squad_features
from widenet_ds.tasks.squad.metrics import evaluate_v1, evaluate_v2
from widenet_ds.tasks.squad.postprocess import SquadDecodeConfig, decode_squad, tune_null_threshold, write_squad_outputs

V1, V2 = "dev-v1.1.json", "dev-v2.0.reconstructed.json"


@pytest.fixture(scope="module")
def squad_v1(shared_data):
    return read_squad_json(shared_data / "squad" / V1)


@pytest.fixture(scope="module")
def squad_v2(shared_data):
    return read_squad_json(shared_data / "squad" / V2)


def test_read_official_files(squad_v1, squad_v2):
    assert (len(squad_v1.examples), squad_v1.version, squad_v1.n_impossible) == (10570, "1.1", 0)
    assert (len(squad_v2.examples), squad_v2.version, squad_v2.n_impossible) == (11873, "2.0", 5945)
    assert sum(len(e.answers) for e in squad_v1.examples) == 34726  # SQuAD CHANGELOG


def test_answer_start_mismatch_names_the_question(tmp_path):
    bad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q-17", "question": "Where?", "answers": [{"text": "France", "answer_start": 3}]}]}]}]}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"question 'q-17': answer_start 3 points at 'is is ', not at the answer "
                                        r"text 'France'; fix the offset"):
        read_squad_json(path)
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"qas": []}]}]}))
    with pytest.raises(DataError, match="article 0 paragraph 0: missing key 'context'"):
        read_squad_json(path)


def test_hf_rows_and_back_to_official_json():
    rows = [{"id": "a", "title": "T", "context": "Paris is in France.", "question": " Where?",
             "answers": {"text": ["France", "in France"], "answer_start": [12, 9]}},
            {"id": "b", "title": "T", "context": "x", "question": "?", "answers": {"text": [], "answer_start": []}}]
    examples = squad_examples_from_hf_rows(rows)
    assert examples[0].answers[1] == SquadAnswer("in France", 9) and examples[1].is_impossible
    official = squad_json_from_examples(examples, "2.0")
    assert evaluate_v2(official["data"], {"a": "france", "b": ""})["exact"] == 100.0
    rows[0]["answers"]["answer_start"] = [0, 9]
    with pytest.raises(DataError, match="question 'a': answer_start 0"):
        squad_examples_from_hf_rows(rows)


def test_windows_match_hf_overflow(squad_v1, bert_tokenizer, hf_reference_tokenizer):
    """Short windows so that most contexts overflow: ids, offsets and window->example map equal HF's
    `truncation="only_second", stride=doc_stride, return_overflowing_tokens=True`."""
    examples = squad_v1.examples[:300]
    cfg = SquadFeatureConfig(max_seq_length=128, doc_stride=32, max_query_length=64)
    ours = build_squad_features(examples, bert_tokenizer, cfg, training=False)
    ref = hf_reference_tokenizer([e.question.lstrip() for e in examples], [e.context for e in examples],
                                 truncation="only_second", max_length=128, stride=32, return_overflowing_tokens=True,
                                 return_offsets_mapping=True, return_token_type_ids=True)
    assert ours.n_truncated_questions == 0  # HF has no max_query_length; parity needs short questions
    assert ours.input_ids == ref["input_ids"]
    assert ours.token_type_ids == ref["token_type_ids"]
    assert ours.example_index == ref["overflow_to_sample_mapping"]
    for i in range(len(ours)):
        seq = ref.sequence_ids(i)
        assert ours.offsets[i] == [tuple(o) if s == 1 else None for o, s in zip(ref["offset_mapping"][i], seq)]
    assert ours.n_multi_window > 150  # most of the 300 contexts need several windows


@pytest.mark.parametrize("name", [V1, V2])
def test_every_question_is_used_or_reported(name, shared_data, bert_tokenizer, capsys):
    data = read_squad_json(shared_data / "squad" / name)
    for cfg in (SquadFeatureConfig(384, 128, 64), SquadFeatureConfig(128, 32, 32)):
        feats = build_squad_features(data.examples, bert_tokenizer, cfg, training=True)
        assert feats.n_used + sum(feats.skipped.values()) == len(data.examples)
        assert len(set(feats.example_index)) == feats.n_used
        print(f"{data.summary()}, training features at {cfg}: {feats.summary()}")
    # Known: one v1.1 answer of 33+ tokens does not fit the 32-token overlap of 128-token windows.
    assert "1 answer span lost to truncation" in feats.summary()
    print(capsys.readouterr().out)


def test_training_targets_point_at_the_answer(squad_v2, bert_tokenizer):
    examples = squad_v2.examples[:800]
    cfg = SquadFeatureConfig(128, 32, 32)
    train = build_squad_features(examples, bert_tokenizer, cfg, training=True)
    evals = build_squad_features(examples, bert_tokenizer, cfg, training=False)
    assert train.input_ids == evals.input_ids  # same windows in both modes (nothing skipped here)
    exact = null_windows = 0
    for i, (s, e) in enumerate(zip(train.start_positions, train.end_positions)):
        ex = examples[train.example_index[i]]
        if s == 0:
            assert e == 0
            null_windows += 1
            continue
        assert not ex.is_impossible and s <= e
        span = ex.context[evals.offsets[i][s][0]:evals.offsets[i][e][1]]
        assert ex.answers[0].text in span  # token boundaries may widen the span, never cut it
        exact += span == ex.answers[0].text
    answered = sum(1 for s in train.start_positions if s)
    assert exact / answered > 0.97
    impossible_windows = sum(examples[j].is_impossible for j in train.example_index)
    assert null_windows >= impossible_windows > 0


def _oracle_logits(examples, feats, rng):
    """Random logits with the gold answer's tokens (first answer) on top where the window holds it."""
    starts, ends = [], []
    for i, ex_index in enumerate(feats.example_index):
        n = len(feats.input_ids[i])
        s_log, e_log = rng.normal(0, 0.5, n), rng.normal(0, 0.5, n)  # random spans stay far below null (6)
        ex = examples[ex_index]
        s_log[0] = e_log[0] = 3.0  # null
        if ex.answers:
            a = ex.answers[0]
            offs = feats.offsets[i]
            inside = [t for t, o in enumerate(offs) if o is not None and o[1] > a.start and o[0] < a.start + len(a.text)]
            if inside and offs[inside[0]][0] <= a.start and offs[inside[-1]][1] >= a.start + len(a.text):
                s_log[inside[0]] = e_log[inside[-1]] = 10.0
        starts.append(s_log)
        ends.append(e_log)
    return starts, ends


def test_decoding_oracle_logits_recovers_answers(squad_v1, squad_v2, bert_tokenizer, tmp_path):
    rng = np.random.default_rng(0)
    # v1.1: the best span is the gold one wherever token boundaries allow.
    ex1 = squad_v1.examples[:1500]
    feats = build_squad_features(ex1, bert_tokenizer, SquadFeatureConfig(), training=False)
    decoded = decode_squad(ex1, feats, *_oracle_logits(ex1, feats, rng))
    data1 = squad_json_from_examples(ex1, "1.1")["data"]
    v1 = evaluate_v1(data1, decoded.predictions("1.1"))
    assert v1["exact_match"] > 98.5
    # The misses are token boundaries: gold "5" inside the token "50" can only be predicted as "50".
    misses = [e for e in ex1 if decoded.best_text[e.qid] != e.answers[0].text]
    assert all(e.answers[0].text in decoded.best_text[e.qid] for e in misses)
    assert all(abs(sum(c["probability"] for c in nb) - 1) < 1e-6 for nb in decoded.nbest.values())
    # v2.0: null (3 + 3 = 6) beats random spans on unanswerable questions, loses to 10 + 10 on answerable ones.
    ex2 = squad_v2.examples[:1500]
    feats = build_squad_features(ex2, bert_tokenizer, SquadFeatureConfig(), training=False)
    decoded = decode_squad(ex2, feats, *_oracle_logits(ex2, feats, rng))
    data2 = squad_json_from_examples(ex2, "2.0")["data"]
    at_zero = evaluate_v2(data2, decoded.predictions("2.0", 0.0))
    assert at_zero["NoAns_exact"] == 100.0 and at_zero["HasAns_exact"] > 98.0
    thresh, swept = tune_null_threshold(data2, decoded)
    tuned = evaluate_v2(data2, decoded.predictions("2.0", thresh))
    assert tuned["f1"] == pytest.approx(swept["best_f1"]) and tuned["f1"] >= at_zero["f1"] - 1e-9
    paths = write_squad_outputs(tmp_path, decoded.predictions("2.0", thresh), decoded.null_odds, decoded.nbest)
    assert [p.name for p in paths] == ["predictions.json", "null_odds.json", "nbest_predictions.json"]
    assert json.loads(paths[1].read_text()) == pytest.approx(decoded.null_odds)


def test_decoding_respects_max_answer_length(bert_tokenizer):
    ctx = "alpha beta gamma delta epsilon"
    ex = [SquadExample("q", "", "which?", ctx, (SquadAnswer("alpha", 0),), False)]
    feats = build_squad_features(ex, bert_tokenizer, SquadFeatureConfig(16, 0, 4), training=False)
    first = feats.offsets[0].index((0, 5))  # "alpha"; one token per word in this vocabulary
    assert [o for o in feats.offsets[0] if o] == [(0, 5), (6, 10), (11, 16), (17, 22), (23, 30)]
    start, end = np.zeros(len(feats.input_ids[0])), np.zeros(len(feats.input_ids[0]))
    start[first], start[first + 1] = 9, 1  # best start "alpha", runner-up "beta"
    end[first + 4], end[first + 1] = 8, 2  # best end "epsilon", runner-up "beta"
    long_ok = decode_squad(ex, feats, [start], [end], SquadDecodeConfig(max_answer_length=5))
    assert long_ok.best_text["q"] == ctx
    short = decode_squad(ex, feats, [start], [end], SquadDecodeConfig(max_answer_length=2))
    assert short.best_text["q"] == "alpha beta"  # 9 + 2 beats "beta" alone (1 + 2)


def test_feature_config_errors():
    with pytest.raises(ConfigError, match="context window of 45 tokens .* not more than doc_stride 128"):
        SquadFeatureConfig(max_seq_length=112, doc_stride=128, max_query_length=64)
