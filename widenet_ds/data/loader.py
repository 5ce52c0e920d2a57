"""Distributed, resumable loader of prepared pretraining data (memory-mapped shards).

Order: in epoch e the examples are visited in a pseudo-random permutation keyed by (seed, e); which positions of
that stream a rank's micro-batch holds is `BatchOrder`'s (data/batch_order.py: global chunks, the same micro-
batches on any shape; rank-strided for checkpoints written before). The permutation is a Feistel network over the
index domain (with cycle walking), evaluated per sample: no index array is built, so memory stays flat whatever
the corpus size.

Dynamic masks are drawn from a generator seeded by (seed, epoch, example index), so a sample is the
same whether it is reached in one run or after a resume. The state is (epoch, positions consumed over all
ranks): restoring it, on this shape or another, makes the next batch exactly the one that would have come next.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

from widenet_ds.data.batch_order import GLOBAL_CHUNKS, BatchOrder
from widenet_ds.data.examples import ExampleConfig, PretrainingIds, mask_tokens
from widenet_ds.data.prepared import PreparedData
from widenet_ds.data.shards import Shard, token_dtype
from widenet_ds.errors import DataError
from widenet_ds.formats import upgrade, versioned

LOADER_STATE = "loader_state.text"  # its kind in widenet_ds/formats.py
_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a fast, well-mixed 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class FeistelPermutation:
    """A bijection of range(n) keyed by `key`, computed per index in O(1) memory."""

    ROUNDS = 4

    def __init__(self, n: int, key: str):
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        self.round_keys = [int.from_bytes(hashlib.sha256(f"{key}/{r}".encode()).digest()[:8], "little")
                           for r in range(self.ROUNDS)]

    def __call__(self, index: int) -> int:
        # Cycle walking: re-encrypt until the value falls inside range(n); the domain is < 4n.
        while True:
            left, right = index >> self.half, index & self.mask
            for round_key in self.round_keys:
                left, right = right, left ^ (_mix64(right ^ round_key) & self.mask)
            index = (left << self.half) | right
            if index < self.n:
                return index


class PretrainingDataLoader:
    """Batches of `input_ids`, `token_type_ids`, `attention_mask`, `mlm_labels` [B, S] and
    `sop_labels` [B] (torch int64) for one data-parallel rank, forever across epochs."""

    def __init__(self, data: str | os.PathLike | PreparedData, micro_batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, dynamic_masking: bool | None = None, split: str = "train",
                 accumulation: int = 1, order: str = GLOBAL_CHUNKS):
        self.order = BatchOrder(micro_batch_size, accumulation, rank, world_size, order)
        data = PreparedData.open(data)  # a path: opened here (a task opens its data once for all its loaders)
        self.data_dir, self.manifest = data.folder, data.manifest
        if split not in self.manifest.splits:
            raise DataError(f"split {split!r} is not in {self.data_dir} (splits: {list(self.manifest.splits)}); "
                            "a corpus too small for the held-out fraction has no 'valid' split: raise "
                            "--valid-fraction or prepare more documents")
        self.ids = PretrainingIds(data.tokenizer)
        if self.ids.vocab_size != self.manifest.vocab_size:
            raise DataError(f"{self.data_dir}/tokenizer.json has {self.ids.vocab_size} tokens but the shards "
                            f"were built with {self.manifest.vocab_size}; re-run `widenet-ds prepare-data`")
        stored_static = self.manifest.masking == "static"
        self.dynamic_masking = not stored_static if dynamic_masking is None else dynamic_masking
        if not self.dynamic_masking and not stored_static:
            raise DataError(f"{self.data_dir} holds no stored masks (prepared with --masking dynamic); use "
                            "dynamic_masking=True or prepare the data with --masking static")
        self.example_config = ExampleConfig(
            seq_length=self.manifest.seq_length, short_seq_prob=0.0, masked_lm_prob=self.manifest.masked_lm_prob,
            max_predictions_per_seq=self.manifest.max_predictions_per_seq, max_ngram=self.manifest.max_ngram)

        dtype = token_dtype(self.manifest.vocab_size)
        split_info = self.manifest.splits[split]
        self.shards = [Shard(self.data_dir / s["name"], s, dtype, self.manifest.vocab_size)
                       for s in split_info.shards]
        self.shard_starts = [0]
        for shard in self.shards:
            self.shard_starts.append(self.shard_starts[-1] + shard.num_examples)
        self.num_examples = self.shard_starts[-1]

        self.micro_batch_size, self.seed = micro_batch_size, seed  # (rank and world: self.order's)
        self.split = split
        self.batches_per_epoch = self.order.micro_batches_per_epoch(self.num_examples)
        if self.batches_per_epoch == 0:
            unit = (f"one step of {self.order.global_batch} (micro batch {micro_batch_size} x {accumulation} "
                    f"accumulation steps x {world_size} ranks)" if order == GLOBAL_CHUNKS
                    else f"one batch of {micro_batch_size} on each of {world_size} ranks")
            raise DataError(f"{self.num_examples} {split} examples cannot fill {unit}; lower the batch size or "
                            f"prepare more data")
        self.epoch = 0
        self.batch = 0  # micro-batches of this epoch already yielded by this rank
        self._permutation = FeistelPermutation(self.num_examples, f"{seed}/0")

    def __len__(self) -> int:
        """Micro-batches per epoch on this rank."""
        return self.batches_per_epoch

    def state_dict(self) -> dict[str, int | str]:
        """Where the epoch is, in terms any shape reads: positions consumed over all ranks."""
        return versioned(LOADER_STATE, {
            "order": self.order.kind, "epoch": self.epoch, "consumed": self.order.consumed(self.batch),
            "seed": self.seed, "num_examples": self.num_examples, "micro_batch_size": self.micro_batch_size,
            "global_batch": self.order.global_batch})

    def load_state_dict(self, state: dict[str, int | str]) -> None:
        state = upgrade(LOADER_STATE, state, "the checkpoint's pretraining loader state")
        if state["num_examples"] != self.num_examples or state["seed"] != self.seed:
            raise DataError(f"loader state is for {state['num_examples']} examples with seed {state['seed']}, "
                            f"this loader has {self.num_examples} with seed {self.seed}: the data folder or the "
                            "seed changed since the checkpoint; resume with the same data and seed")
        written, consumed = state["order"], state["consumed"]
        # (global chunks: a step takes the same samples with any micro batch of the same global batch)
        if written != self.order.kind or (written != GLOBAL_CHUNKS and state["micro_batch_size"] != self.micro_batch_size):
            raise DataError(f"loader state of the {written} order with micro batch {state['micro_batch_size']} "
                            f"cannot continue in the {self.order.kind} order with micro batch {self.micro_batch_size}; "
                            f"resume with the run's batch settings")
        batch = self.order.index_after(consumed, "the checkpoint's loader")
        if batch > self.batches_per_epoch:
            raise DataError(f"loader state position {consumed} is past the epoch's "
                            f"{self.order.consumed(self.batches_per_epoch)} samples; was it saved with other batch "
                            f"settings?")
        self.epoch, self.batch = int(state["epoch"]), batch
        self._permutation = FeistelPermutation(self.num_examples, f"{self.seed}/{self.epoch}")

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            if self.batch >= self.batches_per_epoch:
                self.epoch += 1
                self.batch = 0
                self._permutation = FeistelPermutation(self.num_examples, f"{self.seed}/{self.epoch}")
            indices = self.example_indices(self.batch)
            self.batch += 1  # before yielding: a checkpoint taken now resumes after this batch
            yield self.collate(indices)

    def example_indices(self, batch: int) -> list[int]:
        """The examples of this rank's micro-batch `batch` of the current epoch."""
        return [self._permutation(position) for position in self.order.positions(batch)]

    def collate(self, indices: list[int]) -> dict[str, torch.Tensor]:
        size, seq = len(indices), self.example_config.seq_length
        input_ids = np.full((size, seq), self.ids.pad, dtype=np.int64)
        token_type_ids = np.zeros((size, seq), dtype=np.int64)
        attention_mask = np.zeros((size, seq), dtype=np.int64)
        mlm_labels = np.full((size, seq), -100, dtype=np.int64)
        sop_labels = np.zeros(size, dtype=np.int64)
        for row, index in enumerate(indices):
            shard = bisect.bisect_right(self.shard_starts, index) - 1
            tokens, a_length, sop_label, positions, inputs = self.shards[shard].example(index - self.shard_starts[shard])
            length = len(tokens)
            if self.dynamic_masking:
                rng = random.Random(f"mask/{self.seed}/{self.epoch}/{index}")
                positions, inputs = mask_tokens(tokens.tolist(), self.example_config, self.ids, rng)
            input_ids[row, :length] = tokens
            token_type_ids[row, a_length:length] = 1
            attention_mask[row, :length] = 1
            mlm_labels[row, positions] = input_ids[row, positions]
            input_ids[row, positions] = inputs
            sop_labels[row] = sop_label
        return {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_type_ids),
                "attention_mask": torch.from_numpy(attention_mask), "mlm_labels": torch.from_numpy(mlm_labels),
                "sop_labels": torch.from_numpy(sop_labels)}
