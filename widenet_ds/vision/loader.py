"""Batches of images for each rank, with an exact-resume position, decoded by DataLoader workers.

Workers only decode and resize (deterministic work: every image to image_size x image_size, as the
authors' `prepare_img` does, aspect not kept). Every random augmentation runs afterwards on the whole
batch in the training process (widenet_ds/vision/augment.py), from the global RNG that checkpoints
save, so a resumed run draws the same crops, RandAugment ops and mixup as the uninterrupted one.

Training order: epoch e is a permutation of the train split drawn from (seed, e); it is cut into steps of
micro_batch x accumulation x world examples (the remainder is dropped, as the authors' fixed-shape TPU
batches) and each step into micro-batches by `BatchOrder` (data/batch_order.py: rank r's micro-batch at
accumulation step a is chunk a * world + r), the same micro-batches on any shape. Evaluation is one pass padded with
weight-0 rows to whole global batches, so every rank runs the same number of equal-shape batches (an
expert-parallel all-to-all needs that).
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from widenet_ds.data.batch_order import GLOBAL_CHUNKS, BatchOrder
from widenet_ds.errors import DataError
from widenet_ds.formats import upgrade, versioned
from widenet_ds.vision.datasets import ImageSource

PAD = -1
LOADER_STATE = "loader_state.image"  # its kind in widenet_ds/formats.py


class _Images(Dataset):
    """index -> (uint8 [C, S, S], label, weight); PAD gives image 0 with weight 0."""

    def __init__(self, source: ImageSource, image_size: int, channels: int) -> None:
        self.source = source
        self.image_size = image_size
        self.channels = channels

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        real = index != PAD
        i = index if real else 0
        image = self.source.load(i, self.channels)
        if image.shape[2] != self.channels:
            raise DataError(f"{self.source.name}: image {i} has {image.shape[2]} channel(s), the model expects "
                            f"{self.channels}; set the model's num_channels to {image.shape[2]} "
                            f"(--set num_channels={image.shape[2]}).")
        pixels = torch.from_numpy(np.array(image, dtype=np.uint8, copy=True)).permute(2, 0, 1)
        if pixels.shape[1:] != (self.image_size, self.image_size):
            pixels = F.interpolate(pixels[None].float(), size=(self.image_size, self.image_size), mode="bilinear",
                                   antialias=True, align_corners=False)[0].round().clamp(0, 255).to(torch.uint8)
        return pixels, int(self.source.labels[i]), float(real)


def _collate(rows):
    pixels, labels, weights = zip(*rows)
    return {"pixels": torch.stack(pixels), "labels": torch.tensor(labels, dtype=torch.long),
            "weight": torch.tensor(weights, dtype=torch.float32)}


def default_workers(world_size: int) -> int:
    """Enough decoding processes not to starve a GPU: the cores of this rank's share, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores // max(world_size, 1) - 1))


class ImageLoader:
    """Iterates this rank's micro-batches; `state_dict` is the position after the last batch yielded.

    order: `GLOBAL_CHUNKS`; checkpoints that recorded no order were written when an epoch ended after whole
    micro-batches of every rank rather than whole steps: the same chunks with accumulation 1 (their states
    read as the "legacy" order, formats.py's loader_state.image version 1)."""

    def __init__(self, source: ImageSource, image_size: int, channels: int, micro_batch_size: int, rank: int,
                 world_size: int, seed: int, *, train: bool, workers: int = 0, accumulation: int = 1,
                 order: str = GLOBAL_CHUNKS) -> None:
        self.dataset = _Images(source, image_size, channels)
        self.seed = seed
        self.train = train
        self.workers = workers
        self.legacy = order != GLOBAL_CHUNKS
        self.order = BatchOrder(micro_batch_size, 1 if self.legacy or not train else accumulation, rank, world_size)
        if train and len(source) < self.order.global_batch:
            raise DataError(f"{source.name} has {len(source)} examples, fewer than one step of "
                            f"{self.order.global_batch} (micro batch {micro_batch_size} x {self.order.accumulation} "
                            f"accumulation steps x {world_size} ranks); lower train_batch_size in the DeepSpeed "
                            f"config or use more data.")
        self.epoch = 0
        self.batch = 0

    def batches_per_epoch(self) -> int:
        n = len(self.dataset)
        return self.order.micro_batches_per_epoch(n) if self.train else -(-n // (self.order.micro * self.order.world))

    def state_dict(self) -> dict[str, int | str]:
        return versioned(LOADER_STATE, {"epoch": self.epoch, "consumed": self.order.consumed(self.batch),
                                        "seed": self.seed, "micro_batch_size": self.order.micro,
                                        "order": "legacy" if self.legacy else GLOBAL_CHUNKS})

    def load_state_dict(self, state: dict[str, int | str]) -> None:
        # (a state of a version that did not record the micro batch was written with this run's; global chunks:
        # a step takes the same samples with any micro batch of the same global batch)
        state = upgrade(LOADER_STATE, state, "the checkpoint's image loader state",
                        assume={"micro_batch_size": self.order.micro})
        if (state["order"] == "legacy") != self.legacy:
            raise DataError(f"loader state of the {state['order']} order cannot continue in the "
                            f"{'legacy' if self.legacy else GLOBAL_CHUNKS} order; resume from the run's own checkpoint.")
        if state["seed"] != self.seed or (self.legacy and state["micro_batch_size"] != self.order.micro):
            raise DataError(f"loader state of seed {state['seed']} and micro batch {state['micro_batch_size']} cannot "
                            f"continue with seed {self.seed} and micro batch {self.order.micro}; resume with the run's --seed "
                            f"and batch settings.")
        self.epoch = int(state["epoch"])
        self.batch = self.order.index_after(int(state["consumed"]), "the checkpoint's loader")

    def _order(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if not self.train:
            return np.concatenate([np.arange(n), np.full(self.batches_per_epoch() * self.order.micro * self.order.world - n, PAD)])
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(n, generator=generator).numpy()

    def _rank_batches(self, epoch: int, first: int) -> list[list[int]]:
        order = self._order(epoch)
        return [order[self.order.positions(b)].tolist() for b in range(first, self.batches_per_epoch())]

    def _epoch_batches(self, batches: list[list[int]]) -> Iterator[dict[str, torch.Tensor]]:
        # Its own generator: a DataLoader iterator otherwise draws its base seed from the global RNG, and a
        # resumed run, which starts an iterator mid-epoch, would then draw different augmentations.
        loader = DataLoader(self.dataset, batch_sampler=batches, num_workers=self.workers, collate_fn=_collate,
                            persistent_workers=False, prefetch_factor=4 if self.workers else None,
                            generator=torch.Generator().manual_seed(self.seed))
        yield from loader

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if not self.train:  # one pass from the start
            yield from self._epoch_batches(self._rank_batches(0, 0))
            return
        while True:
            for batch in self._epoch_batches(self._rank_batches(self.epoch, self.batch)):
                self.batch += 1
                yield batch
            self.epoch += 1
            self.batch = 0
