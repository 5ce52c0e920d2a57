"""SQuAD features: `[CLS] question [SEP] context-window [SEP]`, windows overlapping by `doc_stride`
tokens, character offsets of every context token kept for decoding.

This is what HF's fast tokenizer does with `truncation="only_second", stride=doc_stride,
return_overflowing_tokens=True, return_offsets_mapping=True` (question first, `doc_stride` = tokens
shared by consecutive windows), plus BERT's `max_query_length` cut of long questions. Windows are cut
here from one encoding of each context, which keeps the count of lost answers exact.

Training targets: the token span of the first gold answer in each window holding it whole, else
[CLS] (index 0) — the null answer of v2.0 and BERT's/HF's treatment of answer-less windows in v1.1.
An answerable example whose answer fits in no window (longer than the overlap allows) would only
teach "no answer": it is skipped and counted.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import torch

from widenet_ds.errors import ConfigError
from widenet_ds.tasks.finetune.features import FastTokenizer, SpecialIds, pad_batch
from widenet_ds.tasks.squad.data import SquadExample


@dataclass(frozen=True)
class SquadFeatureConfig:
    max_seq_length: int = 384
    doc_stride: int = 128  # tokens shared by consecutive windows
    max_query_length: int = 64

    def __post_init__(self) -> None:
        if self.max_query_length <= 0 or self.doc_stride < 0:
            raise ConfigError("max_query_length must be positive and doc_stride non-negative")
        window = self.max_seq_length - self.max_query_length - 3
        if window <= self.doc_stride:
            raise ConfigError(f"max_seq_length {self.max_seq_length} leaves a context window of {window} tokens after a "
                              f"{self.max_query_length}-token question, not more than doc_stride {self.doc_stride}; "
                              f"raise max_seq_length or lower doc_stride / max_query_length")


@dataclass
class SquadFeatures(torch.utils.data.Dataset):
    """All windows of a list of examples. For evaluation `offsets[i][t]` is the (start, end) character
    span of token t in its example's context, or None outside the context."""

    input_ids: list[list[int]] = field(default_factory=list)
    token_type_ids: list[list[int]] = field(default_factory=list)
    example_index: list[int] = field(default_factory=list)  # into the `examples` given
    offsets: list[list[tuple[int, int] | None]] = field(default_factory=list)
    start_positions: list[int] = field(default_factory=list)  # training only
    end_positions: list[int] = field(default_factory=list)
    n_examples: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> examples
    skipped_qids: dict[str, list[str]] = field(default_factory=dict)  # reason -> first few ids
    n_truncated_questions: int = 0
    n_multi_window: int = 0  # examples whose context needed more than one window
    pad_id: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        item = {"input_ids": self.input_ids[i], "token_type_ids": self.token_type_ids[i], "feature_index": i}
        if self.start_positions:
            item["start_positions"] = self.start_positions[i]
            item["end_positions"] = self.end_positions[i]
        return item

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch([it["input_ids"] for it in items], [it["token_type_ids"] for it in items], self.pad_id)
        batch["feature_index"] = torch.as_tensor([it["feature_index"] for it in items])
        if "start_positions" in items[0]:
            batch["start_positions"] = torch.as_tensor([it["start_positions"] for it in items])
            batch["end_positions"] = torch.as_tensor([it["end_positions"] for it in items])
        return batch

    @property
    def n_used(self) -> int:
        return self.n_examples - sum(self.skipped.values())

    def summary(self) -> str:
        text = (f"{self.n_examples} examples: {self.n_used} used in {len(self)} features "
                f"({self.n_multi_window} needed several windows, {self.n_truncated_questions} questions cut to "
                f"max_query_length)")
        if not self.skipped:
            return text + ", 0 skipped"
        reasons = "; ".join(f"{n} {r} (e.g. {self.skipped_qids[r]})" for r, n in self.skipped.items())
        return f"{text}, {sum(self.skipped.values())} skipped: {reasons}"


def _window_starts(n_tokens: int, window: int, doc_stride: int) -> list[int]:
    starts, start = [0], 0
    while start + window < n_tokens:
        start += window - doc_stride
        starts.append(start)
    return starts


def _answer_token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last context token overlapping [char_start, char_end); None if no token does."""
    ends = [end for _, end in offsets]
    first = bisect.bisect_right(ends, char_start)  # first token ending after the answer starts
    starts = [start for start, _ in offsets]
    last = bisect.bisect_left(starts, char_end) - 1  # last token starting before the answer ends
    if first >= len(offsets) or last < first:
        return None
    return first, last


def build_squad_features(examples: Sequence[SquadExample], tokenizer: FastTokenizer, cfg: SquadFeatureConfig,
                         training: bool) -> SquadFeatures:
    special = SpecialIds.from_tokenizer(tokenizer)
    out = SquadFeatures(n_examples=len(examples), pad_id=special.pad)

    def skip(reason: str, qid: str) -> None:
        out.skipped[reason] += 1
        out.skipped_qids.setdefault(reason, [])
        if len(out.skipped_qids[reason]) < 3:
            out.skipped_qids[reason].append(qid)

    # Contexts are shared by ~5 questions each: encode every distinct one once.
    contexts = list(dict.fromkeys(e.context for e in examples))
    context_enc = dict(zip(contexts, tokenizer.encode_batch(contexts, add_special_tokens=False)))
    # Some v2.0 questions start with whitespace runs; HF strips them too.
    questions = tokenizer.encode_batch([e.question.lstrip() for e in examples], add_special_tokens=False)

    for ex_index, (ex, q_enc) in enumerate(zip(examples, questions)):
        q_ids = q_enc.ids[: cfg.max_query_length]
        out.n_truncated_questions += len(q_enc.ids) > cfg.max_query_length
        if not q_ids:
            skip("empty question", ex.qid)
            continue
        enc = context_enc[ex.context]
        ctx_ids, ctx_offsets = enc.ids, enc.offsets
        if not ctx_ids:
            skip("empty context", ex.qid)
            continue
        window = cfg.max_seq_length - len(q_ids) - 3
        starts = _window_starts(len(ctx_ids), window, cfg.doc_stride)

        answer_span = None
        if training and not ex.is_impossible:
            first = ex.answers[0]
            answer_span = _answer_token_span(ctx_offsets, first.start, first.start + len(first.text))
            if answer_span is None:
                skip("answer text covers no context token", ex.qid)
                continue
            if not any(s <= answer_span[0] and answer_span[1] < s + window for s in starts):
                skip(f"answer span lost to truncation (longer than doc_stride={cfg.doc_stride} tokens allows)", ex.qid)
                continue

        out.n_multi_window += len(starts) > 1
        prefix = [special.cls, *q_ids, special.sep]
        for s in starts:
            chunk = ctx_ids[s: s + window]
            out.input_ids.append(prefix + chunk + [special.sep])
            out.token_type_ids.append([0] * len(prefix) + [1] * (len(chunk) + 1))
            out.example_index.append(ex_index)
            if training:
                if answer_span is not None and s <= answer_span[0] and answer_span[1] < s + len(chunk):
                    out.start_positions.append(answer_span[0] - s + len(prefix))
                    out.end_positions.append(answer_span[1] - s + len(prefix))
                else:
                    out.start_positions.append(0)
                    out.end_positions.append(0)
            else:
                out.offsets.append([None] * len(prefix) + list(ctx_offsets[s: s + len(chunk)]) + [None])
    return out

