"""Token ids for finetuning: checks that tokenizer, model and lengths fit together, BERT-style
`[CLS] a [SEP] b [SEP]` pairs with longest-first truncation, and padding of batches.

Inputs are built from ids encoded without special tokens and joined here, so that truncation is
counted exactly and the user's tokenizer object is never reconfigured (no `enable_truncation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch

from widenet_ds.errors import CheckpointError, ConfigError


class FastTokenizer(Protocol):
    """What we use of `tokenizers.Tokenizer` (the Rust fast tokenizer)."""

    def encode_batch(self, inputs, is_pretokenized: bool = False, add_special_tokens: bool = True): ...
    def token_to_id(self, token: str) -> int | None: ...
    def get_vocab_size(self, with_added_tokens: bool = True) -> int: ...


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    pad: int

    @classmethod
    def from_tokenizer(cls, tokenizer: FastTokenizer, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]"):
        ids = {tok: tokenizer.token_to_id(tok) for tok in (cls_token, sep_token, pad_token)}
        missing = [tok for tok, i in ids.items() if i is None]
        if missing:
            raise ConfigError(f"the tokenizer has no {missing} tokens; finetuning needs a BERT-style vocabulary with "
                              f"[CLS], [SEP] and [PAD] (train it with `widenet-ds train-tokenizer`)")
        return cls(ids[cls_token], ids[sep_token], ids[pad_token])


def check_tokenizer_matches(tokenizer: FastTokenizer, vocab_size: int) -> None:
    """A tokenizer of another vocabulary would feed ids the checkpoint's embeddings never learnt (or
    index past them); refuse it before training instead of failing in an embedding lookup."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:
        raise CheckpointError(f"the tokenizer has {size} tokens but the checkpoint's embeddings have {vocab_size}; "
                              f"use the tokenizer the checkpoint was pretrained with (saved next to it)")


def check_max_length(max_seq_length: int, max_position_embeddings: int) -> None:
    if max_seq_length > max_position_embeddings:
        raise ConfigError(f"max sequence length {max_seq_length} exceeds the model's {max_position_embeddings} "
                          f"position embeddings; pass a max length <= {max_position_embeddings}")
    if max_seq_length < 8:
        raise ConfigError(f"max sequence length {max_seq_length} is too short to hold [CLS] a [SEP] b [SEP]")


def truncate_longest_first(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths after longest-first truncation to `budget` tokens, as the `tokenizers` library (HF fast
    tokenizers) computes it: the shorter side is kept whole if it fits in half the budget; otherwise
    the longer side gets ceil(budget / 2) and the other the rest (b counts as longer on ties)."""
    if len_a + len_b <= budget:
        return len_a, len_b
    short = min(len_a, len_b)
    if short <= budget // 2:
        return (short, budget - short) if len_a <= len_b else (budget - short, short)
    half_up, half_down = (budget + 1) // 2, budget // 2
    return (half_up, half_down) if len_a > len_b else (half_down, half_up)


@dataclass
class EncodedPairs:
    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    n_truncated: int  # examples that lost tokens to max_seq_length


def encode_pairs(tokenizer: FastTokenizer, texts_a: Sequence[str], texts_b: Sequence[str] | None,
                 max_seq_length: int, special: SpecialIds | None = None) -> EncodedPairs:
    special = special or SpecialIds.from_tokenizer(tokenizer)
    ids_a = [e.ids for e in tokenizer.encode_batch(list(texts_a), add_special_tokens=False)]
    ids_b = [e.ids for e in tokenizer.encode_batch(list(texts_b), add_special_tokens=False)] if texts_b else None
    budget = max_seq_length - (3 if ids_b is not None else 2)
    out = EncodedPairs([], [], 0)
    for i, a in enumerate(ids_a):
        b = ids_b[i] if ids_b is not None else []
        keep_a, keep_b = truncate_longest_first(len(a), len(b), budget)
        out.n_truncated += (keep_a, keep_b) != (len(a), len(b))
        tokens = [special.cls, *a[:keep_a], special.sep]
        types = [0] * len(tokens)
        if ids_b is not None:
            tokens += [*b[:keep_b], special.sep]
            types += [1] * (keep_b + 1)
        out.input_ids.append(tokens)
        out.token_type_ids.append(types)
    return out


@dataclass
class GlueFeatures(torch.utils.data.Dataset):
    """Encoded examples of one GLUE split; `collate` pads a batch to its longest member."""

    guids: list[str]
    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: np.ndarray | None  # int64 classes, float32 scores, or None for test data
    n_truncated: int
    pad_id: int = 0
    summary_text: str = field(default="", repr=False)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        item = {"input_ids": self.input_ids[i], "token_type_ids": self.token_type_ids[i]}
        if self.labels is not None:
            item["labels"] = self.labels[i]
        return item

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch([it["input_ids"] for it in items], [it["token_type_ids"] for it in items], self.pad_id)
        if "labels" in items[0]:
            batch["labels"] = torch.as_tensor(np.stack([it["labels"] for it in items]))
        return batch


def pad_batch(input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence: input_ids / token_type_ids / attention_mask, Long[B, S]."""
    longest = max(len(x) for x in input_ids)
    ids = torch.full((len(input_ids), longest), pad_id, dtype=torch.long)
    types = torch.zeros((len(input_ids), longest), dtype=torch.long)
    mask = torch.zeros((len(input_ids), longest), dtype=torch.long)
    for row, (x, t) in enumerate(zip(input_ids, token_type_ids)):
        ids[row, : len(x)] = torch.as_tensor(x)
        types[row, : len(t)] = torch.as_tensor(t)
        mask[row, : len(x)] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def glue_features(split, tokenizer: FastTokenizer, max_seq_length: int) -> GlueFeatures:
    """Encode a `GlueSplit` (from `widenet_ds.tasks.glue.datasets`)."""
    special = SpecialIds.from_tokenizer(tokenizer)
    examples = split.examples
    pairs = encode_pairs(tokenizer, [e.text_a for e in examples],
                         [e.text_b or "" for e in examples] if examples and examples[0].text_b is not None else None,
                         max_seq_length, special)
    labels = None
    if examples and examples[0].label is not None:
        dtype = np.float32 if split.task.is_regression else np.int64
        labels = np.asarray([e.label for e in examples], dtype=dtype)
    summary = f"{split.summary()}; {len(examples)} encoded, {pairs.n_truncated} truncated to {max_seq_length} tokens"
    return GlueFeatures([e.guid for e in examples], pairs.input_ids, pairs.token_type_ids, labels,
                        pairs.n_truncated, special.pad, summary)
