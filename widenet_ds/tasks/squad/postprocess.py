"""From start/end logits of every window to answer texts, as BERT's and HF's run_squad do.

Per example: the n_best_size highest start and end logits of each window form candidate spans
(inside the context, end >= start, at most max_answer_length tokens); a span scores start + end
logit; the best over all windows wins. The null score is the smallest [CLS] start + end over the
windows; `null_odds` = null score - best span score is the no-answer score of v2.0, and a question
gets "" where it exceeds the threshold. The threshold is tuned on dev as the official scorer's
`best_f1_thresh` (what BERT and ALBERT report) by `tune_null_threshold`.

Outputs are the official formats: predictions.json {id: text}, null_odds.json {id: score},
nbest_predictions.json {id: [{text, probability, start_logit, end_logit}]}.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from widenet_ds.errors import ConfigError
from widenet_ds.fs.atomic import atomic_write_json
from widenet_ds.tasks.squad.data import SquadExample
from widenet_ds.tasks.squad.features import SquadFeatures
from widenet_ds.tasks.squad.metrics import evaluate_v2


@dataclass(frozen=True)
class SquadDecodeConfig:
    n_best_size: int = 20
    max_answer_length: int = 30  # tokens

    def __post_init__(self) -> None:
        if self.n_best_size <= 0 or self.max_answer_length <= 0:
            raise ConfigError("n_best_size and max_answer_length must be positive")


@dataclass
class SquadDecoded:
    best_text: dict[str, str] = field(default_factory=dict)  # best non-null span per question
    null_odds: dict[str, float] = field(default_factory=dict)
    nbest: dict[str, list[dict]] = field(default_factory=dict)
    no_candidate: list[str] = field(default_factory=list)  # questions with no valid span in any window

    def predictions(self, version: str, null_threshold: float = 0.0) -> dict[str, str]:
        """v1.1: the best span. v2.0: "" where null_odds > null_threshold."""
        if version == "1.1":
            return dict(self.best_text)
        return {qid: "" if self.null_odds[qid] > null_threshold else text for qid, text in self.best_text.items()}


def _top(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(logits, kind="stable")[::-1][:k]


def decode_squad(examples: Sequence[SquadExample], features: SquadFeatures, start_logits: Sequence[np.ndarray],
                 end_logits: Sequence[np.ndarray], cfg: SquadDecodeConfig = SquadDecodeConfig()) -> SquadDecoded:
    """`start_logits[i]`/`end_logits[i]`: logits of feature i (at least as long as its tokens; padding
    beyond is ignored)."""
    if not features.offsets:
        raise ConfigError("decode_squad needs evaluation features (build_squad_features(..., training=False))")
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise ValueError(f"{len(features)} features but {len(start_logits)} start / {len(end_logits)} end logit rows")
    by_example: dict[int, list[int]] = {}
    for feature, ex_index in enumerate(features.example_index):
        by_example.setdefault(ex_index, []).append(feature)

    out = SquadDecoded()
    for ex_index, example in enumerate(examples):
        null_score = math.inf
        candidates: list[tuple[float, int, int, float, float]] = []  # score, char start, char end, start, end logit
        for feature in by_example.get(ex_index, []):
            offsets = features.offsets[feature]
            starts = np.asarray(start_logits[feature], dtype=np.float64)[: len(offsets)]
            ends = np.asarray(end_logits[feature], dtype=np.float64)[: len(offsets)]
            null_score = min(null_score, starts[0] + ends[0])
            for s in _top(starts, cfg.n_best_size):
                if offsets[s] is None:
                    continue
                for e in _top(ends, cfg.n_best_size):
                    if offsets[e] is None or e < s or e - s + 1 > cfg.max_answer_length:
                        continue
                    candidates.append((starts[s] + ends[e], offsets[s][0], offsets[e][1], starts[s], ends[e]))
        candidates.sort(key=lambda c: -c[0])
        nbest, seen = [], set()
        for score, char_start, char_end, start_logit, end_logit in candidates:
            text = example.context[char_start:char_end]
            if text in seen:  # the same text from overlapping windows counts once, as in BERT
                continue
            seen.add(text)
            nbest.append({"text": text, "score": score, "start_logit": start_logit, "end_logit": end_logit})
            if len(nbest) == cfg.n_best_size:
                break
        if not nbest:
            out.no_candidate.append(example.qid)
            out.best_text[example.qid] = ""
            out.null_odds[example.qid] = 0.0
            out.nbest[example.qid] = []
            continue
        scores = np.asarray([c["score"] for c in nbest])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        for entry, p in zip(nbest, probs):
            entry["probability"] = float(p)
            entry["start_logit"] = float(entry["start_logit"])
            entry["end_logit"] = float(entry["end_logit"])
            del entry["score"]
        out.best_text[example.qid] = nbest[0]["text"]
        # No window at all (the example was skipped) leaves null_score at inf: count it as no candidate above.
        out.null_odds[example.qid] = float(null_score - scores[0])
        out.nbest[example.qid] = nbest
    return out


def tune_null_threshold(dataset: list[dict], decoded: SquadDecoded) -> tuple[float, dict]:
    """`best_f1_thresh` of the official v2.0 scorer, sweeping the null_odds over the best spans (not over
    predictions already cut at some threshold, which could not recover answers below it). Returns the
    threshold and the scorer's dict (best_f1 is the F1 the threshold gives on `dataset`)."""
    metrics = evaluate_v2(dataset, decoded.best_text, na_probs=decoded.null_odds, na_prob_thresh=math.inf)
    return metrics["best_f1_thresh"], metrics


def write_squad_outputs(out_dir: str | os.PathLike, predictions: dict[str, str], null_odds: dict[str, float] | None = None,
                        nbest: dict[str, list[dict]] | None = None) -> list[Path]:
    """predictions.json, and for v2.0 null_odds.json (the official scorer's --na-prob-file), nbest_predictions.json."""
    out_dir = Path(out_dir)
    written = [atomic_write_json(out_dir / "predictions.json", predictions)]
    if null_odds is not None:
        written.append(atomic_write_json(out_dir / "null_odds.json", null_odds))
    if nbest is not None:
        written.append(atomic_write_json(out_dir / "nbest_predictions.json", nbest))
    return written
