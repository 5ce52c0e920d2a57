"""SQuAD scores exactly as the official `evaluate-v1.1.py` and `evaluate-v2.0.py` compute them, and
`widenet-ds squad-eval`.

The two scripts differ in small ways that change numbers, so both are kept:
- v1.1: F1 is 0 whenever no token is shared (an empty prediction scores 0 even against an empty
  gold); a question without a prediction counts 0 (with a message on stderr).
- v2.0: gold answers that normalise to "" are dropped and an unanswerable question's only gold is "";
  F1 is 1 when both sides are empty; `--na-prob` moves predictions to "" above `na_prob_thresh` and
  adds best_exact/best_f1 with their thresholds. The official v2.0 script fails on a missing
  prediction; here that is a DataError naming the ids.
Only the precision-recall plots of the v2.0 script are left out.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import string
import sys
from pathlib import Path

from widenet_ds.errors import DataError
from widenet_ds.formats import load_json

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (same in v1.1 and v2.0)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = re.sub(_ARTICLES, " ", s)
    return " ".join(s.split())


# ---- v1.1 -------------------------------------------------------------------------------------

def f1_score_v1(prediction: str, ground_truth: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def exact_match_score_v1(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def evaluate_v1(dataset: list[dict], predictions: dict[str, str]) -> dict[str, float]:
    f1 = exact_match = total = 0
    unanswered = []
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    unanswered.append(qa["id"])
                    continue
                ground_truths = [x["text"] for x in qa["answers"]]
                prediction = predictions[qa["id"]]
                exact_match += max(exact_match_score_v1(prediction, gt) for gt in ground_truths)
                f1 += max(f1_score_v1(prediction, gt) for gt in ground_truths)
    if unanswered:
        print(f"{len(unanswered)} unanswered questions will receive score 0 (e.g. {unanswered[:3]})", file=sys.stderr)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


# ---- v2.0 -------------------------------------------------------------------------------------

def get_tokens(s: str) -> list[str]:
    if not s:
        return []
    return normalize_answer(s).split()


def compute_exact(a_gold: str, a_pred: str) -> int:
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def make_qid_to_has_ans(dataset: list[dict]) -> dict[str, bool]:
    return {qa["id"]: bool(qa["answers"]) for article in dataset for p in article["paragraphs"] for qa in p["qas"]}


def get_raw_scores(dataset: list[dict], preds: dict[str, str]) -> tuple[dict[str, int], dict[str, float]]:
    exact_scores, f1_scores = {}, {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid = qa["id"]
                gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
                if not gold_answers:
                    # For unanswerable questions, only correct answer is empty string
                    gold_answers = [""]
                a_pred = preds[qid]
                exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh: float) -> dict[str, float]:
    new_scores = {}
    for qid, s in scores.items():
        pred_na = na_probs[qid] > na_prob_thresh
        new_scores[qid] = float(not qid_to_has_ans[qid]) if pred_na else s
    return new_scores


def make_eval_dict(exact_scores, f1_scores, qid_list=None) -> dict:
    if not qid_list:
        total = len(exact_scores)
        return collections.OrderedDict([
            ("exact", 100.0 * sum(exact_scores.values()) / total),
            ("f1", 100.0 * sum(f1_scores.values()) / total),
            ("total", total),
        ])
    total = len(qid_list)
    return collections.OrderedDict([
        ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
        ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
        ("total", total),
    ])


def merge_eval(main_eval: dict, new_eval: dict, prefix: str) -> None:
    for k in new_eval:
        main_eval[f"{prefix}_{k}"] = new_eval[k]


def find_best_thresh(preds, scores, na_probs, qid_to_has_ans) -> tuple[float, float]:
    """Sweep the no-answer threshold over the sorted na_probs; the best total score and its threshold."""
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def find_all_best_thresh(main_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans) -> None:
    best_exact, exact_thresh = find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
    best_f1, f1_thresh = find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
    main_eval["best_exact"] = best_exact
    main_eval["best_exact_thresh"] = exact_thresh
    main_eval["best_f1"] = best_f1
    main_eval["best_f1_thresh"] = f1_thresh


def evaluate_v2(dataset: list[dict], preds: dict[str, str], na_probs: dict[str, float] | None = None,
                na_prob_thresh: float = 1.0) -> dict:
    qid_to_has_ans = make_qid_to_has_ans(dataset)
    missing = [qid for qid in qid_to_has_ans if qid not in preds]
    if missing:
        raise DataError(f"{len(missing)} of {len(qid_to_has_ans)} questions have no prediction (e.g. {missing[:3]}); "
                        f"the official v2.0 scorer cannot score a partial file: predict '' for no answer")
    has_na_file = na_probs is not None
    if na_probs is None:
        na_probs = {k: 0.0 for k in preds}
    missing_na = [qid for qid in qid_to_has_ans if qid not in na_probs]
    if missing_na:
        raise DataError(f"the no-answer file lacks {len(missing_na)} question ids (e.g. {missing_na[:3]})")
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = get_raw_scores(dataset, preds)
    exact_thresh = apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out_eval = make_eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        merge_eval(out_eval, make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids), "HasAns")
    if no_ans_qids:
        merge_eval(out_eval, make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids), "NoAns")
    if has_na_file:
        find_all_best_thresh(out_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans)
    return out_eval


# ---- files and CLI ----------------------------------------------------------------------------

def dataset_version(dataset_json: dict) -> str:
    """'1.1' or '2.0' from the file's version field ('1.1', 'v2.0')."""
    version = str(dataset_json.get("version", "")).lstrip("v")
    if version not in ("1.1", "2.0"):
        raise DataError(f"unknown SQuAD version {dataset_json.get('version')!r} in the data file; pass --version 1.1 or 2.0")
    return version


def _load_json(path: str | Path, what: str):
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} {path}: no such file")
    return load_json(path, DataError, f"pass the {what} as one JSON object")


def _check_mapping(obj, path, value_types: tuple[type, ...], what: str) -> dict:
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a JSON object {{question id: {what}}}, found {type(obj).__name__}")
    bad = [k for k, v in obj.items() if not isinstance(v, value_types) or isinstance(v, bool)]
    if bad:
        raise DataError(f"{path}: {len(bad)} values are not {what} (e.g. {bad[0]!r}: {obj[bad[0]]!r})")
    return obj


def check_squad_shape(dataset, path) -> list[str]:
    """Every question id of a SQuAD `data` list, after checking the official layout (articles ->
    paragraphs -> qas with id and answers) so that a file of another shape is named, not a TypeError."""
    layout = ("the SQuAD layout is {\"data\": [{\"paragraphs\": [{\"context\": str, \"qas\": [{\"id\": str, "
              "\"question\": str, \"answers\": [{\"text\": str, \"answer_start\": int}]}]}]}]}")

    def fail(where: str, problem: str) -> DataError:
        return DataError(f"{path}: {where} {problem}; not a SQuAD dev file ({layout})")

    if not isinstance(dataset, list):
        raise fail("'data'", f"is a {type(dataset).__name__}, not a list of articles")
    qids = []
    for a, article in enumerate(dataset):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise fail(f"data[{a}]", "has no 'paragraphs' list")
        for p, paragraph in enumerate(article["paragraphs"]):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise fail(f"data[{a}].paragraphs[{p}]", "has no 'qas' list")
            for q, qa in enumerate(paragraph["qas"]):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise fail(where, "has no string 'id'")
                answers = qa.get("answers")
                if not isinstance(answers, list) or not all(isinstance(x, dict) and isinstance(x.get("text"), str)
                                                            for x in answers):
                    raise fail(where, "has no 'answers' list of {\"text\": ...} objects")
                qids.append(qa["id"])
    return qids


# Published leaderboard files carry a few ids of questions later removed from dev-v1.1 (28 of 10,585),
# which the official script ignores; more than this fraction means predictions of another file.
UNKNOWN_ID_TOLERANCE = 0.01


def _check_known_ids(mapping: dict, qids: set[str], path, data_path) -> None:
    unknown = [k for k in mapping if k not in qids]
    if unknown and len(unknown) <= UNKNOWN_ID_TOLERANCE * len(mapping):
        print(f"squad-eval: {path}: {len(unknown)} of {len(mapping)} ids are not questions of {data_path} (e.g. "
              f"{unknown[:3]}); ignored, as the official script does", file=sys.stderr)
    elif unknown:
        raise DataError(f"{path}: {len(unknown)} of {len(mapping)} ids are not questions of {data_path} (e.g. "
                        f"{unknown[:3]}); these predictions belong to another data file: score them with the "
                        "data they were made for")


def evaluate_squad_files(data_path, predictions_path, na_prob_path=None, na_prob_thresh: float = 1.0,
                         version: str | None = None) -> dict:
    dataset_json = _load_json(data_path, "SQuAD data")
    if not isinstance(dataset_json, dict) or "data" not in dataset_json:
        raise DataError(f"{data_path}: not a SQuAD file (no top-level 'data' list)")
    qids = set(check_squad_shape(dataset_json["data"], data_path))
    version = version or dataset_version(dataset_json)
    preds = _check_mapping(_load_json(predictions_path, "predictions"), predictions_path, (str,), "answer strings")
    _check_known_ids(preds, qids, predictions_path, data_path)
    if version == "1.1":
        if na_prob_path is not None:
            raise DataError("--na-prob is for SQuAD v2.0 data; the v1.1 scorer has no no-answer probabilities")
        return evaluate_v1(dataset_json["data"], preds)
    na_probs = None
    if na_prob_path is not None:
        na_probs = _check_mapping(_load_json(na_prob_path, "no-answer probabilities"), na_prob_path,
                                  (int, float), "numbers")
        _check_known_ids(na_probs, qids, na_prob_path, data_path)
    return evaluate_v2(dataset_json["data"], preds, na_probs, na_prob_thresh)


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="widenet-ds squad-eval",
                                     description="Official SQuAD v1.1 / v2.0 scores of a predictions file.")
    parser.add_argument("--data", required=True, help="SQuAD dev JSON (version field picks the v1.1 or v2.0 scorer)")
    parser.add_argument("--predictions", required=True, help="JSON {question id: answer text}")
    parser.add_argument("--na-prob", help="v2.0: JSON {question id: no-answer score} (e.g. null_odds.json)")
    parser.add_argument("--na-prob-thresh", type=float, default=1.0,
                        help="v2.0: predict '' where the no-answer score exceeds this (default 1.0, as the official script)")
    parser.add_argument("--version", choices=["1.1", "2.0"], help="override the data file's version field")
    args = parser.parse_args(argv)
    result = evaluate_squad_files(args.data, args.predictions, args.na_prob, args.na_prob_thresh, args.version)
    print(json.dumps(result, indent=2))
    print("squad-eval: the scores are percentages (0-100), as the official script prints them", file=sys.stderr)
    return 0
