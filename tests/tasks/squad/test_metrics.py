"""The SQuAD scorer against the official scripts' behaviour: gold answers, hand-computed tricky cases,
published dev scores of real leaderboard predictions, the v2.0 threshold sweep and the CLI."""

from __future__ import annotations

import json

import pytest

from widenet_ds.errors import DataError
from widenet_ds.tasks.squad import metrics as sm


def _data(*qas, version="v2.0", context="ctx"):
    """A SQuAD dataset list of one paragraph; qas are (id, [gold texts])."""
    return [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": qid, "question": "q?", "answers": [{"text": t, "answer_start": 0} for t in golds]}
        for qid, golds in qas]}]}]


def _load(shared_data, name):
    return json.loads((shared_data / "squad" / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["dev-v1.1.json", "dev-v2.0.reconstructed.json"])
def test_gold_answers_score_100(shared_data, tmp_path, name):
    dataset = _load(shared_data, name)
    gold = {qa["id"]: (qa["answers"][0]["text"] if qa["answers"] else "")
            for a in dataset["data"] for p in a["paragraphs"] for qa in p["qas"]}
    pred_path = tmp_path / "predictions.json"
    pred_path.write_text(json.dumps(gold), encoding="utf-8")
    result = sm.evaluate_squad_files(shared_data / "squad" / name, pred_path)
    if name.startswith("dev-v1.1"):
        assert result == {"exact_match": 100.0, "f1": 100.0}
        assert len(gold) == 10570
    else:
        assert result["exact"] == result["f1"] == 100.0
        assert (result["total"], result["HasAns_total"], result["NoAns_total"]) == (11873, 5928, 5945)
        assert result["HasAns_f1"] == result["NoAns_f1"] == 100.0


# (gold answers, prediction, v2.0 exact, v2.0 F1), computed by hand from the official definitions.
TRICKY = [
    (["the Eiffel Tower"], "Eiffel Tower", 1, 1.0),  # article dropped
    (["Eiffel Tower"], "An Eiffel tower.", 1, 1.0),  # article, case, punctuation
    (["Denver Broncos"], "Broncos", 0, 2 * (1 / 1 * 1 / 2) / (1 + 1 / 2)),  # P=1, R=1/2 -> 2/3
    (["Santa Clara, California"], "Santa Clara California", 1, 1.0),  # comma removed
    (["Beyoncé"], "beyonce", 0, 0.0),  # accents are not folded: different tokens
    (["Beyoncé"], "BEYONCÉ", 1, 1.0),  # but case is, also on non-ASCII letters
    (["1,000"], "1000", 1, 1.0),  # "," is punctuation -> "1000"
    (["theatre"], "the atre", 0, 0.0),  # "the" inside a word is no article; "the atre" -> "atre"
    (["New York", "NYC", "the city"], "city", 1, 1.0),  # max over golds: "the city" -> "city"
    (["a b a"], "a b", 1, 1.0),  # every "a" is an article: "b" vs "b"
    (["cat cat dog"], "cat dog dog", 0, 2 * (2 / 3 * 2 / 3) / (2 / 3 + 2 / 3)),  # multiset overlap 2 -> 2/3
    (["-"], "", 1, 1.0),  # gold normalising to "" is dropped -> only gold "" -> empty prediction right (v2)
    ([], "", 1, 1.0),  # no-answer question, empty prediction (v2)
    ([], "an answer", 0, 0.0),  # no-answer question, non-empty prediction
    (["Paris"], "", 0, 0.0),  # answerable, empty prediction
    (["résumé\u00a0writing"], "Résumé writing!", 1, 1.0),  # NBSP is whitespace for str.split
]


@pytest.mark.parametrize("golds,pred,exact,f1", TRICKY)
def test_tricky_cases_v2(golds, pred, exact, f1):
    result = sm.evaluate_v2(_data(("q", golds)), {"q": pred})
    assert result["exact"] == pytest.approx(100.0 * exact)
    assert result["f1"] == pytest.approx(100.0 * f1)


def test_v1_gold_that_normalises_to_empty_scores_f1_zero(shared_data):
    """An official-script quirk kept on purpose: dev-v1.1 question 57340d124776f419006617bf has the
    gold answer "."; predicting it is an exact match but gets F1 0 under v1.1 (no shared token)."""
    dataset = _load(shared_data, "dev-v1.1.json")["data"]
    qa = next(qa for a in dataset for p in a["paragraphs"] for qa in p["qas"] if qa["id"] == "57340d124776f419006617bf")
    only = [{"title": "", "paragraphs": [{"context": "", "qas": [qa]}]}]
    assert qa["answers"][-1]["text"] == "."
    assert sm.evaluate_v1(only, {qa["id"]: "."}) == {"exact_match": 100.0, "f1": 0.0}
    assert sm.evaluate_v1(only, {qa["id"]: qa["answers"][0]["text"]}) == {"exact_match": 100.0, "f1": 100.0}


def test_v1_and_v2_differ_only_where_the_official_scripts_do():
    # v1.1 F1 is 0 when nothing is shared, even an empty prediction against a gold that normalises to "".
    assert sm.f1_score_v1("", "-") == 0 and sm.compute_f1("-", "") == 1
    assert sm.exact_match_score_v1("", "-") is True
    # v1.1 keeps golds that normalise to "" in the max; v2.0 drops them.
    v1 = sm.evaluate_v1(_data(("q", ["-", "Paris"]), version="1.1"), {"q": "the"})
    assert v1 == {"exact_match": 100.0, "f1": 0.0}  # "the" -> "" == normalised "-"
    v2 = sm.evaluate_v2(_data(("q", ["-", "Paris"])), {"q": "the"})
    assert v2["exact"] == 0.0 and v2["f1"] == 0.0


def test_v1_missing_prediction_counts_zero_v2_refuses(capsys):
    data = _data(("a", ["x"]), ("b", ["y"]))
    assert sm.evaluate_v1(data, {"a": "x"}) == {"exact_match": 50.0, "f1": 50.0}
    assert "1 unanswered" in capsys.readouterr().err
    with pytest.raises(DataError, match="1 of 2 questions have no prediction"):
        sm.evaluate_v2(data, {"a": "x"})


# Dev scores published for these systems: BERT paper Table 2 (BERT-Large ensemble + TriviaQA,
# dev 86.2 EM / 92.2 F1); SQuAD paper (logistic regression, dev 40.0 EM / 51.0 F1 on v1.0,
# 40.1 / 51.0 on the v1.1 file); BERT paper Table 3 (BERT-Large single on v2.0 dev 78.7 EM / 81.9 F1,
# scored here on the reconstructed dev file, hence a looser F1 check).
PUBLISHED_V1 = {
    "bert_ensemble_google_ai_language.json": (86.2, 92.2),
    "logistic_regression_baseline_stanford_university.json": (40.1, 51.0),
}


@pytest.mark.parametrize("name,published", PUBLISHED_V1.items())
def test_leaderboard_predictions_match_published_dev_scores(shared_data, name, published):
    result = sm.evaluate_squad_files(shared_data / "squad" / "dev-v1.1.json",
                                     shared_data / "squad" / "predictions" / "v1.1" / name)
    assert (round(result["exact_match"], 1), round(result["f1"], 1)) == published


def test_v2_scorer_on_v1_data_agrees_with_v1_scorer(shared_data):
    """Where no prediction normalises to "" (a gold "." then scores 0 under both), the two official
    scripts must agree on v1.1 data."""
    path = shared_data / "squad" / "predictions" / "v1.1" / "r_net_ensemble_microsoft_research_asia.json"
    dataset = _load(shared_data, "dev-v1.1.json")["data"]
    preds = json.loads(path.read_text(encoding="utf-8"))
    ids = {qa["id"] for a in dataset for p in a["paragraphs"] for qa in p["qas"]}
    preds = {qid: p if sm.normalize_answer(p := preds.get(qid, "")) else "unanswered" for qid in ids}
    v1 = sm.evaluate_v1(dataset, preds)
    v2 = sm.evaluate_v2(dataset, preds)
    assert v2["exact"] == pytest.approx(v1["exact_match"]) and v2["f1"] == pytest.approx(v1["f1"])
    assert 80 < v1["f1"] < 90


def test_v2_bert_single_and_threshold_sweep(shared_data):
    squad = shared_data / "squad"
    bert = sm.evaluate_squad_files(squad / "dev-v2.0.reconstructed.json",
                                   squad / "predictions" / "v2.0" / "bert_single_model_google_ai_language.json")
    assert round(bert["exact"], 1) == 78.7 and abs(bert["f1"] - 81.9) < 0.2
    preds_path = squad / "predictions" / "v2.0_with_na_prob" / "bert_base_nstats_predictions.json"
    na_path = squad / "predictions" / "v2.0_with_na_prob" / "bert_base_nstats_null_odds.json"
    result = sm.evaluate_squad_files(squad / "dev-v2.0.reconstructed.json", preds_path, na_path)
    assert result["best_f1"] >= result["f1"] and result["best_exact"] >= result["exact"]
    # Re-derive best_f1 by applying the threshold: predictions above it become "" (no na-prob file).
    dataset = _load(shared_data, "dev-v2.0.reconstructed.json")["data"]
    preds = json.loads(preds_path.read_text())
    na = json.loads(na_path.read_text())
    cut = {q: ("" if na[q] > result["best_f1_thresh"] else p) for q, p in preds.items()}
    assert sm.evaluate_v2(dataset, cut)["f1"] == pytest.approx(result["best_f1"])
    # The main numbers move with --na-prob-thresh exactly as apply_no_ans_threshold says.
    strict = sm.evaluate_v2(dataset, preds, na, na_prob_thresh=-1e9)  # every question predicted "no answer"
    assert strict["exact"] == pytest.approx(100.0 * 5945 / 11873) and strict["HasAns_f1"] == 0.0


def test_find_best_thresh_by_hand():
    data = _data(("h1", ["x"]), ("h2", ["y"]), ("n1", []), ("n2", []))
    preds = {"h1": "x", "h2": "wrong", "n1": "z", "n2": "z"}
    na = {"h1": -2.0, "h2": 0.5, "n1": 1.0, "n2": -1.0}
    # Sorted by na: h1(-2, +1), n2(-1, -1), h2(0.5, +0), n1(1, -1); start 2 (both no-answers right)
    # -> scores 3, 2, 2, 1: best 3 at thresh -2 -> 75%.
    result = sm.evaluate_v2(data, preds, na)
    assert result["best_exact"] == 75.0 and result["best_exact_thresh"] == -2.0
    assert result["best_f1"] == 75.0 and result["best_f1_thresh"] == -2.0


def test_cli_prints_official_dict(shared_data, capsys):
    squad = shared_data / "squad"
    rc = sm.cli(["--data", str(squad / "dev-v2.0.reconstructed.json"), "--predictions",
                 str(squad / "predictions" / "v2.0_with_na_prob" / "bert_base_nstats_predictions.json"),
                 "--na-prob", str(squad / "predictions" / "v2.0_with_na_prob" / "bert_base_nstats_null_odds.json")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                         "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def test_cli_errors_are_clear(tmp_path, shared_data):
    from widenet_ds.cli import main

    dev = str(shared_data / "squad" / "dev-v1.1.json")
    bad = tmp_path / "p.json"
    bad.write_text('["not", "a", "dict"]')
    with pytest.raises(DataError, match="expected a JSON object"):
        sm.cli(["--data", dev, "--predictions", str(bad)])
    bad.write_text('{"id": 3}')
    with pytest.raises(DataError, match="not answer strings"):
        sm.cli(["--data", dev, "--predictions", str(bad)])
    with pytest.raises(DataError, match="no such file"):
        sm.cli(["--data", dev, "--predictions", str(tmp_path / "missing.json")])
    bad.write_text("{}")
    with pytest.raises(DataError, match="--na-prob is for SQuAD v2.0"):
        sm.cli(["--data", dev, "--predictions", str(bad), "--na-prob", str(bad)])
    weird = {"version": "3", "data": []}
    (tmp_path / "d.json").write_text(json.dumps(weird))
    with pytest.raises(DataError, match="pass --version"):
        sm.cli(["--data", str(tmp_path / "d.json"), "--predictions", str(bad)])
    # Through the console entry: a message and exit status 2, no traceback.
    assert main(["squad-eval", "--data", dev, "--predictions", str(tmp_path / "missing.json")]) == 2
