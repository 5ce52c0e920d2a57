"""Distributed, resumable loader of prepared pretraining data (memory-mapped shards).

Order: in epoch e the examples are visited in a pseudo-random permutation keyed by (seed, e), and
rank r of W takes the permuted stream's positions r, r + W, r + 2W, ... (as `DistributedSampler`).
The permutation is a Feistel network over the index domain (with cycle walking), evaluated per
sample: no index array is built, so memory stays flat whatever the corpus size.

Dynamic masks are drawn from a generator seeded by (seed, epoch, example index), so a sample is the
same whether it is reached in one run or after a resume. The state is (epoch, position): the number
of samples this rank has consumed in the epoch. Restoring it makes the next batch exactly the one
that would have come next.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from widenet_ds.data.examples import ExampleConfig, PretrainingIds, mask_tokens
from widenet_ds.data.shards import Shard, read_manifest, token_dtype
from widenet_ds.data.tokenizer import load_tokenizer
from widenet_ds.errors import DataError

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

    def __init__(self, data_dir: str | os.PathLike, micro_batch_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, dynamic_masking: bool | None = None, split: str = "train", drop_last: bool = True):
        if micro_batch_size < 1:
            raise DataError(f"micro_batch_size {micro_batch_size} must be at least 1")
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is outside the world of {world_size} ranks")
        self.data_dir = Path(data_dir)
        self.manifest = read_manifest(self.data_dir)
        if split not in self.manifest["splits"]:
            raise DataError(f"split {split!r} is not in {self.data_dir} (splits: {list(self.manifest['splits'])}); "
                            "a corpus too small for the held-out fraction has no 'valid' split: raise "
                            "--valid-fraction or prepare more documents")
        tokenizer = load_tokenizer(self.data_dir)  # checks its hash against the manifest
        self.ids = PretrainingIds(tokenizer)
        if self.ids.vocab_size != self.manifest["vocab_size"]:
            raise DataError(f"{self.data_dir}/tokenizer.json has {self.ids.vocab_size} tokens but the shards "
                            f"were built with {self.manifest['vocab_size']}; re-run `widenet-ds prepare-data`")
        stored_static = self.manifest["masking"] == "static"
        self.dynamic_masking = not stored_static if dynamic_masking is None else dynamic_masking
        if not self.dynamic_masking and not stored_static:
            raise DataError(f"{self.data_dir} holds no stored masks (prepared with --masking dynamic); use "
                            "dynamic_masking=True or prepare the data with --masking static")
        self.example_config = ExampleConfig(
            seq_length=self.manifest["seq_length"], short_seq_prob=0.0,
            masked_lm_prob=self.manifest["masked_lm_prob"],
            max_predictions_per_seq=self.manifest["max_predictions_per_seq"], max_ngram=self.manifest["max_ngram"])

        dtype = token_dtype(self.manifest["vocab_size"])
        split_info = self.manifest["splits"][split]
        self.shards = [Shard(self.data_dir / s["name"], s, dtype, self.manifest["vocab_size"])
                       for s in split_info["shards"]]
        self.shard_starts = [0]
        for shard in self.shards:
            self.shard_starts.append(self.shard_starts[-1] + shard.num_examples)
        self.num_examples = self.shard_starts[-1]

        self.micro_batch_size, self.rank, self.world_size, self.seed = micro_batch_size, rank, world_size, seed
        self.split, self.drop_last = split, drop_last
        per_rank = self.num_examples // world_size if drop_last else -(-self.num_examples // world_size)
        self.samples_per_epoch = per_rank // micro_batch_size * micro_batch_size if drop_last else per_rank
        if self.samples_per_epoch == 0:
            raise DataError(f"{self.num_examples} {split} examples cannot fill one batch of {micro_batch_size} "
                            f"on each of {world_size} ranks; lower the batch size or prepare more data")
        self.epoch = 0
        self.position = 0  # samples of this epoch already yielded by this rank
        self._permutation = FeistelPermutation(self.num_examples, f"{seed}/0")

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return -(-self.samples_per_epoch // self.micro_batch_size)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "world_size": self.world_size, "num_examples": self.num_examples,
                "micro_batch_size": self.micro_batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_examples"] != self.num_examples or state["seed"] != self.seed:
            raise DataError(f"loader state is for {state['num_examples']} examples with seed {state['seed']}, "
                            f"this loader has {self.num_examples} with seed {self.seed}: the data folder or the "
                            "seed changed since the checkpoint; resume with the same data and seed")
        position = state["position"]
        if state["world_size"] != self.world_size:
            # All ranks consume in lockstep, so the global stream is consumed up to position * W.
            consumed = position * state["world_size"]
            if consumed % self.world_size:
                raise DataError(f"cannot resume {consumed} consumed samples on {self.world_size} ranks exactly; "
                                f"resume with world size {state['world_size']} or a divisor of {consumed}")
            position = consumed // self.world_size
        if position > self.samples_per_epoch:
            raise DataError(f"loader state position {position} is past the epoch's {self.samples_per_epoch} "
                            "samples on this rank; was it saved with other batch settings?")
        self.epoch = state["epoch"]
        self.position = position
        self._permutation = FeistelPermutation(self.num_examples, f"{self.seed}/{self.epoch}")

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            if self.position >= self.samples_per_epoch:
                self.epoch += 1
                self.position = 0
                self._permutation = FeistelPermutation(self.num_examples, f"{self.seed}/{self.epoch}")
            count = min(self.micro_batch_size, self.samples_per_epoch - self.position)
            indices = [self.example_index(self.position + i) for i in range(count)]
            batch = self.collate(indices)
            self.position += count  # before yielding: a checkpoint taken now resumes after this batch
            yield batch

    def example_index(self, position: int) -> int:
        """The example at `position` of this rank's current epoch."""
        return self._permutation((position * self.world_size + self.rank) % self.num_examples)

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
