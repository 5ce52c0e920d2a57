"""ALBERT pretraining examples: sentence-pair packing with SOP labels, and n-gram MLM masking.

Follows `create_pretraining_data.py` of google-research/albert:
- segments (sentences) of one document are packed into a chunk up to a target length (the max
  length, or with `short_seq_prob` a random shorter one); the chunk is cut at a random segment
  boundary into A and B; with probability 0.5 they are swapped (sentence-order label 1);
- masking picks whole words in n-gram spans (n <= 3 with p(n) ~ 1/n), 15% of the tokens, each
  replaced by [MASK] 80%, a random token 10%, itself 10%.

One deliberate difference: ALBERT fills B from a random other document when a chunk holds a single
segment (an NSP leftover that gives SOP label 1 to unrelated text). Here a chunk keeps growing until
it has two segments, and a sentence left alone at the end of a document is counted and dropped.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from widenet_ds.errors import DataError


MIN_SEQ_LENGTH = 32


@dataclass(frozen=True)
class ExampleConfig:
    seq_length: int = 128
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int | None = None  # None: ceil(masked_lm_prob * seq_length)
    max_ngram: int = 3

    def __post_init__(self) -> None:
        if not MIN_SEQ_LENGTH <= self.seq_length <= 65535:
            # Below it the two segments of a sentence-order pair are a few tokens each: no sentence order to learn.
            raise DataError(f"--seq-length {self.seq_length} must be between {MIN_SEQ_LENGTH} and 65535 (ALBERT: 128 "
                            f"or 512); {self.seq_length} leaves {max(self.seq_length - 3, 0)} tokens for the two "
                            f"segments of a sentence-order pair.")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise DataError(f"--short-seq-prob {self.short_seq_prob} must be a probability in [0, 1]")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise DataError(f"--masked-lm-prob {self.masked_lm_prob} must be in (0, 1); ALBERT uses 0.15")
        if self.max_ngram < 1:
            raise DataError(f"--max-ngram {self.max_ngram} must be at least 1; ALBERT uses 3")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise DataError("--max-predictions-per-seq must be at least 1")

    @property
    def max_predictions(self) -> int:
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        return math.ceil(self.masked_lm_prob * self.seq_length)

    @property
    def max_segment_tokens(self) -> int:
        """Longer sentences are cut into pieces of this size so two of them fit one example."""
        return (self.seq_length - 3) // 2


@dataclass(frozen=True)
class Example:
    tokens: list[int]  # [CLS] A [SEP] B [SEP]
    a_length: int      # len([CLS] A [SEP]): token type 0 up to here, 1 after
    sop_label: int     # 0 = A before B as in the text, 1 = swapped


class PretrainingIds:
    """Ids the example builder and the masker need, read from the tokenizer."""

    def __init__(self, tokenizer: Tokenizer):
        vocab = tokenizer.get_vocab()
        self.pad, self.cls, self.sep, self.mask = (vocab[t] for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
        self.vocab_size = tokenizer.get_vocab_size()
        # bytearray lookups are the fastest per-token test in pure Python.
        self.continuation = bytearray(self.vocab_size)
        self.special = bytearray(self.vocab_size)
        for token, index in vocab.items():
            self.continuation[index] = token.startswith("##")
            self.special[index] = token.startswith("[") and token.endswith("]")
        # Random replacements come from real word pieces, never [PAD]/[CLS]/[unusedN].
        self.replacement_ids = [i for i in range(self.vocab_size) if not self.special[i]]


def create_examples(segments: Sequence[Sequence[int]], config: ExampleConfig, ids: PretrainingIds,
                    rng: random.Random, stats: Counter) -> list[Example]:
    """The examples of one document, given its sentences as token-id lists."""
    if len(segments) < 2:
        stats["document with fewer than 2 sentences (no SOP pair)"] += 1
        return []
    max_tokens = config.seq_length - 3
    target = max_tokens
    if rng.random() < config.short_seq_prob:
        target = rng.randint(2, max_tokens)
    examples: list[Example] = []
    chunk: list[Sequence[int]] = []
    chunk_length = 0
    for index, segment in enumerate(segments):
        chunk.append(segment)
        chunk_length += len(segment)
        last = index == len(segments) - 1
        if not (last or (chunk_length >= target and len(chunk) >= 2)):
            continue
        if len(chunk) < 2:
            stats["sentence left without a pair at the end of a document"] += 1
        else:
            a_end = rng.randint(1, len(chunk) - 1)
            tokens_a = [t for s in chunk[:a_end] for t in s]
            tokens_b = [t for s in chunk[a_end:] for t in s]
            sop_label = 0
            if rng.random() < 0.5:
                tokens_a, tokens_b, sop_label = tokens_b, tokens_a, 1
            _truncate_pair(tokens_a, tokens_b, max_tokens, rng)
            tokens = [ids.cls, *tokens_a, ids.sep, *tokens_b, ids.sep]
            examples.append(Example(tokens, len(tokens_a) + 2, sop_label))
        chunk, chunk_length = [], 0
        target = max_tokens
        if rng.random() < config.short_seq_prob:
            target = rng.randint(2, max_tokens)
    return examples


def _truncate_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer side, from the front or the back at random, until the pair fits (as BERT)."""
    while len(tokens_a) + len(tokens_b) > max_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def mask_tokens(tokens: Sequence[int], config: ExampleConfig, ids: PretrainingIds,
                rng: random.Random) -> tuple[list[int], list[int]]:
    """ALBERT n-gram whole-word masking of one example.

    Returns (positions, inputs): the predicted positions in increasing order and the token the input
    holds there ([MASK], a random token or the original). The labels are `tokens[positions]`.
    """
    # Whole words: a "##" piece joins the word before it. Special tokens are never masked.
    words: list[list[int]] = []
    for position, token in enumerate(tokens):
        if ids.special[token]:
            continue
        if ids.continuation[token] and words and words[-1][-1] == position - 1:
            words[-1].append(position)
        else:
            words.append([position])
    num_to_predict = min(config.max_predictions, max(1, round(len(tokens) * config.masked_lm_prob)))
    weights = [1.0 / n for n in range(1, config.max_ngram + 1)]
    starts = list(range(len(words)))
    rng.shuffle(starts)
    covered: set[int] = set()
    chosen: list[int] = []
    for start in starts:
        if len(chosen) >= num_to_predict:
            break
        max_n = min(config.max_ngram, len(words) - start)
        n = rng.choices(range(1, max_n + 1), weights=weights[:max_n])[0]
        # Back off to shorter n-grams while the span would overshoot the budget.
        while n > 1 and len(chosen) + _span_size(words, start, n) > num_to_predict:
            n -= 1
        span = [p for word in words[start:start + n] for p in word]
        if len(chosen) + len(span) > num_to_predict or any(p in covered for p in span):
            continue
        covered.update(span)
        chosen.extend(span)
    chosen.sort()
    inputs = []
    for position in chosen:
        draw = rng.random()
        if draw < 0.8:
            inputs.append(ids.mask)
        elif draw < 0.9:
            inputs.append(tokens[position])
        else:
            inputs.append(ids.replacement_ids[rng.randrange(len(ids.replacement_ids))])
    return chosen, inputs


def _span_size(words: list[list[int]], start: int, n: int) -> int:
    return sum(len(word) for word in words[start:start + n])
